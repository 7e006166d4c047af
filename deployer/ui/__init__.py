"""Everything a person sees: live views, plans, reports, charts; with cli/, the only importer of rich."""
