"""Source connectors, sync state, parsing and chunking: raw corpora to documents and chunks."""
