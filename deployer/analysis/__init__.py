"""Judging a new build against a baseline on its serving metrics (issue 37 item 1): latency histograms compared
window by window with a rank test, critical counters that fail on any increase, and a verdict that says why.

exposition (a /metrics read) -> window (deltas between reads, restarts flagged) -> observed (pooled per side)
-> judge (checks' verdicts and the report); quantile and mannwhitney are the arithmetic. Pure: no I/O.
"""

from deployer.analysis.checks import Check, CriticalCounter, LatencyCheck, sglang_checks
from deployer.analysis.exposition import ExpositionError, Scrape, parse_scrape
from deployer.analysis.judge import Report, Verdict, before_after, canary_vs_baseline, judge, judge_samples

__all__ = ["Check", "CriticalCounter", "ExpositionError", "LatencyCheck", "Report", "Scrape", "Verdict",
           "before_after", "canary_vs_baseline", "judge", "judge_samples", "parse_scrape", "sglang_checks"]
