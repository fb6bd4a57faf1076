"""Embeddings, the hybrid Chroma + BM25 index, the agent harness and its tools, policies, trajectories."""
