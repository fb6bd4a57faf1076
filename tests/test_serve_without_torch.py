"""The search service runs where the training stack is not installed (`searchsmith[serve]`).

A child process makes torch, transformers, sentence-transformers, peft, trl and datasets
unimportable, then indexes real paragraphs with the packaged MiniLM (the numpy backend),
and answers `/v1/search` through the service with the heuristic policy. The numpy encoder's
vectors are checked against sentence-transformers' on the same texts, so an index built by
the pipeline (torch) is searched by the service (numpy) in the same vector space.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from search.embeddings import Embedder
from search.numpy_encoder import check_supported
from tests.test_index import DATA

REPO = Path(__file__).resolve().parents[1]
TRAINING_STACK = ("torch", "transformers", "sentence_transformers", "peft", "trl", "datasets")

CHILD = textwrap.dedent("""
    import json, sys
    BLOCKED = set(sys.argv[1].split(","))
    for name in BLOCKED:  # as if not installed: `import` fails and `find_spec` says None
        sys.modules[name] = None
    from pathlib import Path
    from starlette.testclient import TestClient
    from search.chroma_client import persistent_client
    from search.embeddings import Embedder
    from serving.api import create_app
    from serving.api_keys import ApiKeyStore
    from tests.test_index import chunk_table, make_index

    root = Path(sys.argv[2])
    records = [json.loads(line) for line in Path(sys.argv[3]).read_text().splitlines() if line.strip()][:4]
    embedder = Embedder()
    index = make_index(persistent_client(root / "chroma"), root, "acme", embedder)
    index.build_or_update(chunk_table(records))
    keys = ApiKeyStore(root / "keys.json")
    key = keys.create_key("acme")
    app = create_app(keys, lambda: {"acme"}, lambda customer: index, lambda customer: "heuristic")
    with TestClient(app) as client:
        reply = client.post("/v1/search", json={"customer": "acme", "query": records[0]["question"], "k": 5},
                            headers={"Authorization": f"Bearer {key}"})
    loaded = sorted(name for name, module in sys.modules.items() if module is not None and name.split(".")[0] in BLOCKED)
    print(json.dumps({"status": reply.status_code, "body": reply.json(), "backend": embedder.backend, "loaded": loaded}))
""")


def test_search_service_answers_without_the_training_stack(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", CHILD, ",".join(TRAINING_STACK), str(tmp_path), str(DATA)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reply = json.loads(result.stdout.strip().splitlines()[-1])
    assert reply["backend"] == "numpy" and reply["loaded"] == []
    assert reply["status"] == 200, reply["body"]
    gold = {p["title"] for p in json.loads(DATA.read_text().splitlines()[0])["paragraphs"] if p["is_supporting"]}
    returned = [document["title"] for document in reply["body"]["documents"]]
    assert gold & set(returned), (gold, returned)


def test_numpy_backend_gives_the_torch_backend_vectors():
    texts = ["Which team won the first FA Cup Final, played at Kennington Oval in 1872?", "Hi",
             "The Wanderers beat the Royal Engineers 1-0 in the 1872 FA Cup Final. " * 40]  # past the 256-token window
    torch_vectors = Embedder(backend="torch").encode(texts)
    numpy_vectors = Embedder(backend="numpy").encode(texts)
    assert numpy_vectors.shape == torch_vectors.shape == (3, 384)
    assert np.abs(numpy_vectors - torch_vectors).max() < 1e-5


def test_numpy_backend_names_what_it_cannot_run(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "xlm-roberta", "hidden_act": "gelu"}))
    with pytest.raises(ValueError, match=r"model_type 'xlm-roberta'.*pooling other than mean.*no model.safetensors"):
        check_supported(tmp_path)
    with pytest.raises(ValueError, match="embedding backend 'onnx'"):
        Embedder(backend="onnx")
