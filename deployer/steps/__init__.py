"""The step kinds (one module each; `kinds.KINDS` names them), what a step sees of the run (`context`), its
actions as data (`action`), and the load generator behind `storm` and `baseline` (`loadgen`); what a kind may do beyond
planning and running is a protocol it opts into (`optional`)."""
