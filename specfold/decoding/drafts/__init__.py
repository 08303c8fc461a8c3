"""Draft policies: guess future block states from the parent step's scores."""
