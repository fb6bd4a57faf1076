"""The per-customer reranker and selection, end to end on a real corpus: extractive tasks from the
demo Wikipedia paragraphs, (question, chunk) pairs from them, a real MiniLM cross-encoder
fine-tuned for a few steps, judged on the dev split, kept and reused through the artifact store,
then used to select the final ranking of real episodes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.policy_spec import PolicySpec
from agent.selection import CALIBRATED_POLICIES, SelectionSettings, calibrated_as, fuse, policy_order, settings_for
from core.storage import LocalArtifactStore
from core.task_settings import TaskGenConfig
from core.training_settings import RerankerSettings
from evaluation.candidates import SelectedCandidate, build_candidate
from evaluation.synth_tasks import tasks_from_synth
from search.reranker import Reranker
from synth.generate import generate_tasks
from tests.test_synth_extractive import demo_frames, demo_index  # noqa: F401 - module fixtures: the demo corpus and its index
from training.per_customer import (RerankerCheckpoint, calibrated_start, collect_sft_trajectories, read_reranker,
                                   train_reranker_checkpoint, train_tasks)
from training.reranker import Pair, train_reranker, training_pairs

SETTINGS = RerankerSettings(kind="cross", max_tasks=16, distractors=3, hard_negatives=3, batch_size=16, learning_rate=1e-4, eval_tasks=8,
                            eval_depth=10, torch_threads=2)
# The default kind, sized like the cross-encoder's run: a bi-encoder learns from in-batch negatives.
BI_SETTINGS = RerankerSettings(max_tasks=16, hard_negatives=3, batch_size=16, eval_tasks=8, eval_depth=10, torch_threads=2)
KINDS = {"cross": SETTINGS, "bi": BI_SETTINGS}


@pytest.fixture(scope="module")
def tasks(demo_frames, demo_index):  # noqa: F811 - the imported fixture
    chunks, documents = demo_frames
    result = generate_tasks(chunks, documents, demo_index, TaskGenConfig(max_seeds=40, seed=3, distractors_per_task=6), llm=None, store=None)
    return result.verified_tasks


@pytest.fixture(scope="module", params=sorted(KINDS))
def trained(request, tasks, demo_frames, demo_index, tmp_path_factory):  # noqa: F811
    store = LocalArtifactStore(tmp_path_factory.mktemp("store"))
    home = tmp_path_factory.mktemp("home")
    checkpoint = train_reranker_checkpoint("acme", store, demo_index, tasks, demo_frames[0], KINDS[request.param], home)
    return store, home, checkpoint


def test_pairs_label_evidence_chunks_against_distractors_and_hard_negatives(tasks, demo_frames, demo_index):  # noqa: F811
    train = [t for t in tasks if t.split == "train"][:10]
    question_pairs = SETTINGS.model_copy(update={"chain_pairs": False})  # chains: the next test
    pairs = training_pairs(train, demo_frames[0], demo_index, question_pairs)
    positives = [p for p in pairs if p.label == 1.0]
    negatives = [p for p in pairs if p.label == 0.0]
    assert positives and len(negatives) > len(positives)
    gold_titles = {t.agent_query: {demo_index.document_title(i) for i in t.supporting_ids} for t in train}
    assert all(p.text.split("\n", 1)[0] in gold_titles[p.query] for p in positives)  # shown as "title\ntext"
    assert all(p.text.split("\n", 1)[0] not in gold_titles[p.query] for p in negatives)  # never a gold document
    assert training_pairs(train, demo_frames[0], demo_index, question_pairs) == pairs  # deterministic

    # short views: each task is also asked in a few of its words, with the same gold and its own hard negatives
    brief = training_pairs(train, demo_frames[0], demo_index, question_pairs.model_copy(update={"short_queries": 1}))
    questions = {t.agent_query for t in train}
    views = {p.query for p in brief} - questions
    assert views and all(len(view.split()) <= SETTINGS.short_query_words + 2 for view in views)
    assert [p for p in brief if p.query in questions] == pairs
    view_of = {p.query: t for t in train for p in brief if p.query in views and p.label == 1.0
               and p.text.split("\n", 1)[0] in {demo_index.document_title(i) for i in t.supporting_ids}}
    assert set(view_of) == views  # every view keeps a positive of its own task


def test_chain_pairs_extend_the_question_with_one_hop_and_label_the_next(tasks, demo_frames, demo_index):  # noqa: F811
    train = [t for t in tasks if t.split == "train"]
    bridged = [t for t in train if len(t.supporting_ids) > 1][:4]
    assert bridged, "the demo tasks have multi-hop ones"
    plain = training_pairs(bridged, demo_frames[0], demo_index, SETTINGS.model_copy(update={"chain_pairs": False}))
    chained = training_pairs(bridged, demo_frames[0], demo_index, SETTINGS)
    assert SETTINGS.chain_pairs  # the default
    extra = [p for p in chained if p not in plain]
    assert [p for p in chained if p in plain] == plain  # the question's own pairs are unchanged
    for task in bridged:
        first, second = (demo_index.document_title(item.id) for item in task.supporting_items[:2])
        mine = [p for p in extra if p.query.startswith(f"{task.agent_query} {first}\n")]
        assert mine, task.agent_query  # the question, then the first hop's evidence as selection reads it
        assert {p.text.split("\n", 1)[0] for p in mine if p.label == 1.0} == {second}  # the next hop is the answer
        assert all(p.text.split("\n", 1)[0] not in (first, second) for p in mine if p.label == 0.0)


def test_the_trained_reranker_is_judged_on_the_dev_split_and_kept_in_the_store(trained, tasks, demo_frames, demo_index):  # noqa: F811
    store, home, checkpoint = trained
    kind = checkpoint.train["metrics"]["kind"]
    assert Reranker.load(checkpoint.path).kind == kind  # the folder says what it is
    if kind == "cross":  # a cross-encoder cannot be read, or trained on, as a bi-encoder
        with pytest.raises(ValueError, match="not a bi-encoder"):
            Reranker.load(checkpoint.path, kind="bi")
        with pytest.raises(ValueError, match="cannot start a bi-encoder"):
            train_reranker([Pair("q", "a", 1.0), Pair("q", "b", 0.0)], BI_SETTINGS.model_copy(update={"base": checkpoint.path}), home / "x")
    assert checkpoint.train["pairs"] > 0 and checkpoint.train["steps"] > 0 and checkpoint.train["pairs_per_s"] > 0
    assert set(checkpoint.dev) == {"hybrid", "start", "trained"}
    assert all(0.0 <= row["recall_at_k"] <= 1.0 and row["tasks"] == checkpoint.dev["hybrid"]["tasks"] > 0 for row in checkpoint.dev.values())
    if kind == "cross":
        assert checkpoint.beats_start, checkpoint.dev  # the recipe's claim: trained on synthetic tasks, better on unseen ones
    else:  # the bi-encoder's start already ranks this small corpus's dev tasks as well as hybrid's top 10 allows:
        # training moved its scores and did not lose what the start had (the real-scale claim: docs/results.md, bench/bench_dev.py)
        assert checkpoint.dev["trained"]["recall_at_k"] >= checkpoint.dev["start"]["recall_at_k"], checkpoint.dev
        question, texts = "Who wrote it?", ["It was written by a poet.", "A river runs through the valley."]
        trained_scores = Reranker.load(checkpoint.path).score(question, texts)
        assert trained_scores != pytest.approx(Reranker.load().score(question, texts), abs=1e-4)
        # the folder the trainer saved (today's pooling config) scores as the fp32 model does without torch
        with pytest.MonkeyPatch.context() as fp32:
            fp32.setenv("SEARCHSMITH_CPU_DTYPE", "float32")
            trained_scores = Reranker.load(checkpoint.path).score(question, texts)
        assert Reranker.load(checkpoint.path, backend="numpy").score(question, texts) == pytest.approx(trained_scores, abs=1e-4)
    # the same dev tasks asked briefly, hybrid's order and the trained one's
    assert set(checkpoint.dev_brief) == {"hybrid", "trained"}
    assert all(row["tasks"] == checkpoint.dev["hybrid"]["tasks"] for row in checkpoint.dev_brief.values())
    assert read_reranker(store, "acme").run_id == checkpoint.run_id
    assert any(key.endswith("config.json") for key in store.list(checkpoint.key))
    # selection's policy weight, chosen on the dev split, travels with the weights
    from training.selection_weight import WEIGHTS

    from training.selection_weight import CHAIN_CHOICES

    weight, chain = checkpoint.selection["policy_weight"], checkpoint.selection["chain_anchors"]
    assert weight in WEIGHTS and chain in CHAIN_CHOICES and checkpoint.selection["tasks"] > 0
    loaded = Reranker.load(checkpoint.path)
    assert (loaded.policy_weight, loaded.chain_anchors) == (weight, chain)
    assert settings_for(loaded) == SelectionSettings(policy_weight=weight, chain_anchors=chain)
    by_weight, by_choice = checkpoint.selection["recall_at_k_by_weight"], checkpoint.selection["recall_at_k_by_choice"]
    assert by_weight[str(weight)] == max(by_weight.values()) == max(by_choice.values()) == by_choice[f"chain{chain}/{weight:g}"]
    # each kind of candidate has its own choice, made on its own episodes: the agent's is the top level,
    # a single-shot list (hybrid, bm25, dense) selects with hybrid's
    by_policy = checkpoint.selection["by_policy"]
    assert tuple(by_policy) == CALIBRATED_POLICIES and by_policy["heuristic"]["policy_weight"] == weight
    for policy, choice in by_policy.items():
        assert choice["policy"] == policy and choice["policy_weight"] in WEIGHTS and choice["tasks"] == checkpoint.selection["tasks"]
        scores = choice["recall_at_k_by_choice"]
        assert scores[f"chain{choice['chain_anchors']}/{choice['policy_weight']:g}"] == max(scores.values())
    single = by_policy["hybrid"]
    for spec in ("hybrid+rerank", "bm25", "dense+rerank"):
        assert settings_for(loaded, spec) == SelectionSettings(policy_weight=single["policy_weight"], chain_anchors=single["chain_anchors"])
    for spec in ("heuristic+rerank", "heuristic@4+rerank", "transformers:smollm2+rerank", None):
        assert settings_for(loaded, spec) == SelectionSettings(policy_weight=weight, chain_anchors=chain)
    assert any(key.endswith("searchsmith_selection.json") for key in store.list(checkpoint.key))

    # a rerun with the same inputs reuses it; a worker without the folder pulls it from the store
    shutil.rmtree(checkpoint.path)
    again = train_reranker_checkpoint("acme", store, demo_index, tasks, demo_frames[0], KINDS[kind], home)
    assert again.reused and again.run_id == checkpoint.run_id and (again.path and Reranker.load(again.path).score("q", ["t"]))


def test_a_rerun_after_a_failed_step_repeats_only_the_steps_that_did_not_finish(trained, tasks, demo_frames, demo_index,  # noqa: F811
                                                                                tmp_path, monkeypatch):
    import json

    import training.reranker
    import training.selection_weight
    from training.per_customer import RERANKER_CHECKED_FILE

    store, home, checkpoint = trained
    kind = checkpoint.train["metrics"]["kind"]

    def repeated(step):
        def fail(*args, **kwargs):
            raise AssertionError(f"the {step} was repeated")
        return fail

    monkeypatch.setattr(training.reranker, "train_reranker", repeated("training"))
    monkeypatch.setattr(training.reranker, "dev_recall", repeated("dev check"))
    monkeypatch.setattr(training.selection_weight, "calibrate", repeated("calibration"))
    empty = LocalArtifactStore(tmp_path / "store")  # no manifest: the upload failed last time
    again = train_reranker_checkpoint("acme", empty, demo_index, tasks, demo_frames[0], KINDS[kind], home)
    assert not again.reused and again.run_id == checkpoint.run_id and again.path == checkpoint.path
    assert {key: again.train[key] for key in ("pairs", "steps", "train_s")} == {key: checkpoint.train[key] for key in ("pairs", "steps", "train_s")}
    assert (again.dev, again.dev_brief, again.selection) == (checkpoint.dev, checkpoint.dev_brief, checkpoint.selection)
    assert read_reranker(empty, "acme").run_id == checkpoint.run_id

    if kind != "bi":  # the resume does not depend on the kind: the calibration is paid for once, with the default kind
        return
    # the calibration failed last time: it runs again, and only it
    record = again.path and (Path(again.path) / RERANKER_CHECKED_FILE)
    checks = json.loads(record.read_text(encoding="utf-8"))
    record.write_text(json.dumps({key: value for key, value in checks.items() if key != "selection"}), encoding="utf-8")
    monkeypatch.undo()
    monkeypatch.setattr(training.reranker, "train_reranker", repeated("training"))
    monkeypatch.setattr(training.reranker, "dev_recall", repeated("dev check"))
    calibrated = train_reranker_checkpoint("acme", LocalArtifactStore(tmp_path / "store2"), demo_index, tasks, demo_frames[0], KINDS[kind], home)
    assert calibrated.selection == checkpoint.selection and calibrated.dev == checkpoint.dev
    assert json.loads(record.read_text(encoding="utf-8")) == checks  # recorded again as it finished


def test_a_reranker_calibrated_before_choices_per_kind_is_calibrated_again_once(trained, tasks, demo_frames, demo_index,  # noqa: F811
                                                                                 monkeypatch):
    """Reused weights whose calibration has one choice for every kind (before 2026-12-07) get the
    per-kind calibration beside them, and are neither trained nor judged again."""
    import json

    import training.reranker
    from core.layout import reranker_manifest_key

    store, home, checkpoint = trained
    kind = checkpoint.train["metrics"]["kind"]
    if kind != "bi":  # the reuse path does not depend on the kind
        return
    old = {key: value for key, value in checkpoint.selection.items() if key != "by_policy"}
    store.write_text(reranker_manifest_key("acme"), json.dumps({**checkpoint.to_dict(), "selection": old}, default=str))
    (Path(checkpoint.path) / "searchsmith_selection.json").write_text(json.dumps(old), encoding="utf-8")
    loaded = Reranker.load(checkpoint.path)
    assert not loaded.by_policy and settings_for(loaded, "hybrid") == settings_for(loaded, "heuristic")  # one choice for all

    def repeated(*args, **kwargs):
        raise AssertionError("the reranker was trained or judged again")

    monkeypatch.setattr(training.reranker, "train_reranker", repeated)
    monkeypatch.setattr(training.reranker, "dev_recall", repeated)
    again = train_reranker_checkpoint("acme", store, demo_index, tasks, demo_frames[0], KINDS[kind], home)
    assert again.reused and again.selection == checkpoint.selection  # the same tasks and episodes: the same choices
    assert read_reranker(store, "acme").selection == checkpoint.selection
    assert Reranker.load(checkpoint.path).by_policy  # beside the weights, where selection reads it


def test_the_untrained_start_is_calibrated_by_the_trained_rerankers_rule_as_the_baseline_it_must_beat(tasks, demo_frames, demo_index,  # noqa: F811
                                                                                                        tmp_path):
    """`bench/reranker_dev.py --against-start`'s baseline: the packaged MiniLM as a reranker folder, with
    a choice per kind made on the same dev tasks, read by selection as a trained reranker's is."""
    from search.reranker import start_model_dir

    folder = calibrated_start(tasks, demo_frames[0], demo_index, BI_SETTINGS, tmp_path / "start")
    import json

    start = Reranker.load(folder)
    assert start.by_policy.keys() == set(CALIBRATED_POLICIES)
    calibration = json.loads((folder / "searchsmith_selection.json").read_text())
    assert all(choice["tasks"] == BI_SETTINGS.eval_tasks for choice in calibration["by_policy"].values())
    assert (folder / "model.safetensors").read_bytes() == (start_model_dir() / "model.safetensors").read_bytes()  # untrained
    hybrid = calibration["by_policy"]["hybrid"]
    assert settings_for(start, "hybrid+rerank") == SelectionSettings(policy_weight=hybrid["policy_weight"], chain_anchors=hybrid["chain_anchors"])
    with pytest.raises(ValueError, match="kind cross: only a bi-encoder"):
        calibrated_start(tasks, demo_frames[0], demo_index, SETTINGS, tmp_path / "cross")


def test_each_policy_selects_with_its_kinds_choice():
    assert [calibrated_as(spec) for spec in ("hybrid", "bm25+rerank", "dense", "heuristic", "heuristic+rerank", "openai:http://x#m", None)] \
        == ["hybrid", "hybrid", "hybrid", "heuristic", "heuristic", "heuristic", "heuristic"]
    reranker = Reranker(Path("unused"), policy_weight=2.0, chain_anchors=3, by_policy={"hybrid": (1.0, 3)})
    assert settings_for(reranker, "hybrid+rerank") == SelectionSettings(policy_weight=1.0, chain_anchors=3)
    assert settings_for(reranker, "heuristic+rerank") == SelectionSettings(policy_weight=2.0, chain_anchors=3)  # not calibrated apart: the top level


def test_selection_reorders_only_what_the_episode_surfaced(trained, tasks, demo_frames, demo_index):  # noqa: F811
    _, _, checkpoint = trained
    reranker = Reranker.load(checkpoint.path)
    bench = tasks_from_synth([t for t in tasks if t.split == "test"][:3], demo_frames[0])
    for spec in ("heuristic+rerank", "hybrid+rerank"):
        candidate = build_candidate(PolicySpec.parse(spec), demo_index, 5, reranker=reranker)
        assert isinstance(candidate, SelectedCandidate)
        for task in bench:
            trajectory = candidate.run(task.question, task_id=task.task_id)
            output = trajectory.output_doc_ids()
            assert 0 < len(output) <= 5 and len(set(output)) == len(output)
            assert set(output) <= set(trajectory.seen_doc_ids())  # never adds a document
            assert trajectory.policy == spec and "policy_ranking" in trajectory.metadata


def test_a_selecting_teacher_distils_the_selected_answers(trained, tasks, demo_frames, demo_index, tmp_path):  # noqa: F811
    """`heuristic+rerank` as the SFT teacher (once the gate serves it): each rollout's final ranking
    is rebuilt by selection before the filter, and the answer the student is taught says the same."""
    from agent.final_answer import parse_final_answer
    from agent.harness import HarnessConfig
    from agent.policies import load_policy
    from core.training_settings import TeacherSettings

    _, _, checkpoint = trained
    store = LocalArtifactStore(tmp_path / "store")
    train = train_tasks(tasks, demo_frames[0], max_tasks=4)
    data = collect_sft_trajectories("acme", store, demo_index, train, load_policy("heuristic", max_docs=5),
                                    TeacherSettings(workers=1), tmp_path / "work", harness=HarnessConfig(max_output_docs=5),
                                    reranker=Reranker.load(checkpoint.path))
    assert data.kept and data.metadata["teacher"] == "heuristic+rerank"
    for trajectory in data.kept:
        assert trajectory.metadata["selection"] == "reranker" and len(trajectory.final_ranking) <= 5
        assert set(trajectory.output_doc_ids()) <= set(trajectory.seen_doc_ids())
        final = next(turn for turn in reversed(trajectory.turns) if not turn.tool_calls)
        for text in (final.completion, trajectory.final_text):
            parsed = parse_final_answer(text, document_title=demo_index.document_title, chunk_docs=trajectory.chunk_docs)
            assert [doc.doc_id for doc in parsed.documents] == trajectory.output_doc_ids() and not parsed.errors


def test_fusion_keeps_agreement_first_and_policy_weight_zero_is_the_reranker_alone():
    policy, judged = ["a", "b", "c", "d"], ["c", "a", "d", "b"]
    assert fuse(policy, judged, SelectionSettings())[0] in {"a", "c"}
    assert fuse(policy, judged, SelectionSettings(policy_weight=0.0)) == judged
    assert fuse(policy, judged, SelectionSettings(policy_weight=100.0)) == policy


def test_policy_order_lists_the_ranking_then_other_surfaced_documents(trained, demo_index):  # noqa: F811
    candidate = build_candidate(PolicySpec.parse("heuristic"), demo_index, 3)
    trajectory = candidate.run("Which team won the first FA Cup Final?")
    order = policy_order(trajectory)
    assert order[: len(trajectory.output_doc_ids())] == trajectory.output_doc_ids()
    assert set(order) == set(trajectory.seen_doc_ids()) | set(trajectory.output_doc_ids())


def test_rerank_specs_parse_and_need_a_reranker(demo_index, tmp_path):  # noqa: F811
    spec = PolicySpec.parse("heuristic@4+rerank")
    assert (spec.policy, spec.n, spec.rerank, spec.name) == ("heuristic", 4, True, "heuristic@4+rerank")
    assert PolicySpec.parse("hybrid+rerank").is_baseline
    with pytest.raises(ValueError, match="needs a reranker"):
        build_candidate(spec, demo_index, 5)
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "absent")):
        Reranker.load(tmp_path / "absent")


def test_the_search_service_serves_a_promoted_rerank_policy_as_it_was_benchmarked(trained, tasks, demo_frames, demo_index, tmp_path):  # noqa: F811
    """`heuristic+rerank` is eligible at the gate, and the search path (CLI and HTTP service)
    answers with the same selection the benchmark measured, from the customer's own reranker."""
    from starlette.testclient import TestClient

    from core.serving_settings import PromotionSettings
    from serving.api import create_app
    from serving.api_keys import ApiKeyStore
    from serving.per_customer import customer_reranker
    from serving.promotion import adapter_of, eligibility
    from serving.search import run_search

    store, _, checkpoint = trained
    assert eligibility("heuristic+rerank", PromotionSettings()) is None
    assert eligibility("hybrid+rerank", PromotionSettings()) is not None  # still a baseline underneath
    assert adapter_of("transformers:/models/acme/sft/1a2b+rerank") == ("/models/acme/sft/1a2b", None)

    reranker = customer_reranker(store, "acme")
    assert reranker is not None and reranker.path == Reranker.load(checkpoint.path).path
    assert customer_reranker(store, "nobody") is None
    question = [t for t in tasks if t.split == "test"][0].question
    measured = build_candidate(PolicySpec.parse("heuristic+rerank"), demo_index, 5, reranker=reranker).run(question)
    served = run_search(demo_index, question, "heuristic+rerank", k=5, reranker=reranker)
    assert [d["doc_id"] for d in served.documents] == measured.output_doc_ids()
    assert served.trajectories[0].metadata["policy_ranking"] == measured.metadata["policy_ranking"]
    with pytest.raises(ValueError, match="reranker_checkpoint"):
        run_search(demo_index, question, "heuristic+rerank", k=5)

    keys = ApiKeyStore(tmp_path / "api_keys.json")
    key = keys.create_key("acme")
    app = create_app(keys, lambda: {"acme"}, lambda customer: demo_index, lambda customer: "heuristic+rerank",
                     reranker_for=lambda customer: reranker)
    reply = TestClient(app).post("/v1/search", json={"customer": "acme", "query": question, "k": 5},
                                 headers={"Authorization": f"Bearer {key}"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["policy"] == "heuristic+rerank" and reply.json()["documents"] == served.documents


def test_the_reranker_identity_leaves_short_views_out_when_they_are_off():
    """A cross-encoder trained before short views and kinds existed keeps its run id (reused, not trained again)."""
    from training.per_customer import reranker_identity

    unchained = SETTINGS.model_copy(update={"chain_pairs": False})  # how every reranker before 2026-12-07 was trained
    before = unchained.model_dump(exclude={"torch_threads", "eval_tasks", "eval_depth", "short_queries", "short_query_words", "kind",
                                           "chain_pairs", "precision"})
    assert reranker_identity(unchained) == before
    assert reranker_identity(unchained.model_copy(update={"short_query_words": 6})) == before
    on = reranker_identity(unchained.model_copy(update={"short_queries": 1}))
    assert on["short_queries"] == 1 and on != before
    chains = reranker_identity(SETTINGS)  # chain pairs are the default now: trained anew, never the old weights
    assert chains["chain_pairs"] is True and chains != before
    # `auto` is this machine's speed, not a recipe; a precision the file names trains other weights
    assert reranker_identity(SETTINGS.model_copy(update={"precision": "bf16"}))["precision"] == "bf16"


def test_the_training_precision_follows_the_cpu_unless_the_file_names_one(monkeypatch):
    import torch

    import training.reranker as reranker_training
    from training.reranker import training_precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for flags, expected in (("bf16", "bf16"), ("fp32", "fp32")):
        monkeypatch.setattr(reranker_training, "cpu_training_precision", lambda flags=flags: flags)
        assert training_precision(BI_SETTINGS) == expected
        assert training_precision(BI_SETTINGS.model_copy(update={"precision": "fp32"})) == "fp32"
        assert training_precision(BI_SETTINGS.model_copy(update={"precision": "bf16"})) == "bf16"
    with pytest.raises(ValueError, match="precision"):
        RerankerSettings.model_validate({"precision": "fp16"})


def test_a_bf16_run_trains_in_autocast_and_saves_fp32_weights(tmp_path):
    """bf16 is autocast: the matmuls run in bf16, the weights the optimizer updates (and the folder
    saved) stay fp32, so the served reranker loads as any other."""
    import torch
    from safetensors.torch import load_file

    texts = ["Hamlet is a tragedy by William Shakespeare.", "The Eiffel Tower stands in Paris.",
             "Mount Everest is the highest mountain.", "The Nile flows through Egypt."]
    pairs = [pair for i, text in enumerate(texts) for pair in (Pair(f"question {i} about {text.split()[0]}", text, 1.0),
                                                              Pair(f"question {i} about {text.split()[0]}", texts[i - 1], 0.0))]
    run = train_reranker(pairs, BI_SETTINGS.model_copy(update={"precision": "bf16", "batch_size": 4}), tmp_path / "bf16")
    assert run.metrics["precision"] == "bf16" and run.steps >= 1
    weights = load_file(next((tmp_path / "bf16").rglob("model.safetensors")))
    assert {tensor.dtype for tensor in weights.values()} == {torch.float32}
    assert all(score == score for score in Reranker.load(tmp_path / "bf16").score("Who wrote Hamlet?", texts))  # finite, loads


@pytest.mark.parametrize(("start", "trained", "verdict"), [
    ((0.80, 0.90), (0.85, 0.90), "pass"),  # better recall
    ((0.80, 0.90), (0.80, 0.95), "pass"),  # same recall, better MRR
    ((0.80, 0.90), (0.80, 0.90), "fail"),  # a tie below the ceiling is not a gain
    ((0.90, 0.95), (0.85, 0.99), "fail"),
    ((1.00, 1.00), (1.00, 1.00), "warn"),  # nothing to beat: reported, the lineage goes on
    ((1.00, 1.00), (0.95, 1.00), "fail"),  # worse than a perfect start still stops it
])
def test_the_dev_check_warns_only_when_the_start_leaves_nothing_to_beat(start, trained, verdict):
    dev = {name: {"recall_at_k": recall, "mrr": mrr, "tasks": 4} for name, (recall, mrr) in (("start", start), ("trained", trained))}
    checkpoint = RerankerCheckpoint(customer="c", run_id="r", path="p", key="k", base="b", train={}, dev=dev)
    found, why = checkpoint.verdict()
    assert found == verdict and "4 dev tasks" in why


def test_a_kind_fills_what_the_customer_file_leaves_unset():
    """`kind: cross` alone gets the cross-encoder's recipe; what the file sets is kept; a bi-encoder's
    identity names its kind (it is never reused for a cross-encoder's run)."""
    from core.training_settings import RERANKER_KIND_DEFAULTS
    from training.per_customer import reranker_identity

    assert RerankerSettings().kind == "bi" and RerankerSettings().model_dump(include=set(RERANKER_KIND_DEFAULTS["bi"])) == RERANKER_KIND_DEFAULTS["bi"]
    cross = RerankerSettings.model_validate({"kind": "cross", "learning_rate": 1e-4})
    assert cross.distractors == RERANKER_KIND_DEFAULTS["cross"]["distractors"] and cross.learning_rate == 1e-4
    assert reranker_identity(RerankerSettings())["kind"] == "bi"
    with pytest.raises(ValueError, match="kind"):
        RerankerSettings.model_validate({"kind": "colbert"})


def test_a_bi_encoder_scores_by_cosine_the_same_with_torch_and_numpy(tmp_path, monkeypatch):
    """The packaged MiniLM is the bi-encoder's start: the answering passage first, and the torch-free
    backend (a serving-only install) gives the same scores as the fp32 model."""
    monkeypatch.setenv("SEARCHSMITH_CPU_DTYPE", "float32")  # not bf16 batches where the CPU has it: one precision compared
    from search.reranker import folder_kind, start_model_dir

    assert folder_kind(start_model_dir()) == "bi"
    texts = ["Hamlet is a tragedy written by William Shakespeare around 1600.", "The Eiffel Tower stands in Paris."]
    torch_scores = Reranker.load(backend="torch").score("Who wrote Hamlet?", texts)
    numpy_scores = Reranker.load(backend="numpy").score("Who wrote Hamlet?", texts)
    assert torch_scores[0] > torch_scores[1] and all(-1.0 <= s <= 1.0 for s in torch_scores)
    assert numpy_scores == pytest.approx(torch_scores, abs=1e-4)
    assert Reranker.load(kind="cross").kind == "cross"  # the cross-encoder's untrained start: the same folder, a fresh head
    with pytest.raises(FileNotFoundError, match="not a model"):
        Reranker.load(tmp_path)


CHAIN_QUESTION = "What time does the state where Greenfield-Central High is stop selling booze?"
CHAIN_CANDIDATES = [
    ("school", ["Greenfield-Central High School\nGreenfield-Central High School is a public high school in Greenfield, Indiana.",
                "Greenfield-Central High School\nIts teams are the Cougars."]),
    ("indiana", ["Alcohol laws of Indiana\nIn Indiana, retail sales of alcoholic beverages end at 3 a.m."]),
    ("utah", ["Alcohol laws of Utah\nUtah sells liquor in state-run stores, which close at 10 p.m."]),
    ("river", ["White River (Indiana)\nThe White River flows through central Indiana."]),
]


@pytest.mark.parametrize("kind", ["bi", "cross"])
def test_a_chain_scores_its_first_link_by_the_question_and_the_next_by_the_question_extended_with_it(kind, monkeypatch):
    """Each document takes the best two-document chain through it: s(q, a) + s(q + a's best text, d),
    `a` among the `anchors` best documents by the question alone, as the first or the second link."""
    monkeypatch.setenv("SEARCHSMITH_CPU_DTYPE", "float32")  # scores of one text and of a batch alike, to compare to 1e-4
    reranker = Reranker.load(kind=kind)
    direct = dict(reranker.order(CHAIN_QUESTION, CHAIN_CANDIDATES))
    for anchors in (1, 2, 4):
        firsts = sorted(direct, key=lambda doc: -direct[doc])[:anchors]
        expected = {doc: float("-inf") for doc in direct}
        for first in firsts:
            texts = dict(CHAIN_CANDIDATES)[first]
            best_text = max(texts, key=lambda text: reranker.score(CHAIN_QUESTION, [text])[0])
            following = dict(reranker.order(f"{CHAIN_QUESTION} {best_text}", CHAIN_CANDIDATES))
            for doc in direct:
                if doc != first:
                    expected[doc] = max(expected[doc], direct[first] + following[doc])
                    expected[first] = max(expected[first], direct[first] + following[doc])
        chained = reranker.chain_order(CHAIN_QUESTION, CHAIN_CANDIDATES, anchors)
        assert dict(chained) == pytest.approx(expected, abs=1e-4)
        assert [score for _, score in chained] == sorted((score for _, score in chained), reverse=True)  # best first
    assert reranker.chain_order(CHAIN_QUESTION, CHAIN_CANDIDATES[:1], 3) == reranker.order(CHAIN_QUESTION, CHAIN_CANDIDATES[:1])
    assert reranker.chain_order(CHAIN_QUESTION, [], 3) == []


def test_a_bi_encoder_judges_chains_the_same_with_torch_and_numpy(monkeypatch):
    monkeypatch.setenv("SEARCHSMITH_CPU_DTYPE", "float32")  # the numpy port is of the fp32 model
    by_torch = Reranker.load(backend="torch").chain_order(CHAIN_QUESTION, CHAIN_CANDIDATES, 3)
    by_numpy = Reranker.load(backend="numpy").chain_order(CHAIN_QUESTION, CHAIN_CANDIDATES, 3)
    assert [doc for doc, _ in by_numpy] == [doc for doc, _ in by_torch]
    assert dict(by_numpy) == pytest.approx(dict(by_torch), abs=1e-4)


def test_the_learning_benchmark_selects_from_a_rows_own_episodes_as_the_live_candidate_does(trained, tasks, demo_frames, demo_index,  # noqa: F811
                                                                                              tmp_path):
    """`bench/learning.py --reranker DIR`: a student row's `+rerank` row is computed from the episodes
    the row already ran, and gives what running `SPEC+rerank` gives (here with the deterministic
    heuristic standing in for the student)."""
    from bench.learning import selected_row
    from evaluation.bench import run_benchmark

    _, _, checkpoint = trained
    bench = tasks_from_synth([t for t in tasks if t.split == "test"][:4], demo_frames[0])
    report = run_benchmark(bench, demo_index, ["heuristic", "heuristic+rerank"], 5, tmp_path / "sft", progress=False, workers=1,
                           reranker=Reranker.load(checkpoint.path))
    live = report["policies"]["heuristic+rerank"]
    for path in (tmp_path / "sft" / "trajectories").glob("heuristic_rerank*"):  # the row holds its own episodes only
        path.unlink()
    row = {"row": "sft", "policy": "heuristic", "n": len(bench), "parseable_final": 1.0, "valid_tool_calls": 1.0, "tool_calls": 3.0,
           "mean_prompt_tokens": 0.0}
    selected = selected_row("sft+rerank", row, bench, demo_index, tmp_path, Path(checkpoint.path))
    assert selected["policy"] == "heuristic+rerank" and selected["n"] == len(bench)
    assert selected["answer_found"] == pytest.approx(live["answer_found"]) and selected["recall"] == pytest.approx(live["recall"])
    assert len((tmp_path / "sft+rerank" / "scores" / "selected.jsonl").read_text().splitlines()) == len(bench)
    assert selected_row("sft+rerank", row, bench, demo_index, tmp_path, Path(checkpoint.path)) == selected  # a rerun reuses it
