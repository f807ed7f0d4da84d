"""Reporting: results tables, plots, the dashboard, the runtime lookup and strategy comparisons."""
