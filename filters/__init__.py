"""The filter chain: one Filter protocol, decisions as values, one filter per file."""
