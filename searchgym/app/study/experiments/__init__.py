"""The reports of the studies run before study protocols (LLD-1, LLD-2, the learning study, LLD-3, LEARN-2):
their per-run summaries, tables, pre-registered criteria and figures, which ``scripts/lld_report.py``
launches."""
