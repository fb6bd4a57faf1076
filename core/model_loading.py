"""One lock for building a model in this process, whichever package builds it.

Why: transformers builds models on the meta device under process-wide patches, so two threads
constructing models at once can leave one of them with meta tensors. The embedder, the
cross-encoder and the policy's model each load once per process, but from different packages,
and the threads that first need them can overlap (the search service's first requests: one
loads a checkpoint for its policy while another loads the embedder for its query, or the
customer's cross-encoder). Loads are rare and short next to what the models then do, so they
take turns. Re-entrant, so a loader may build a model that builds another.
"""

from __future__ import annotations

import threading

MODEL_LOAD_LOCK = threading.RLock()
