"""The search service fuzzed from its own OpenAPI document (schemathesis), in-process over ASGI.

Two properties, each over a bounded, derandomized set of generated requests against the same
two small real indexes and real key store as `test_serving_api.py`:

- any request the document allows or forbids (positive and negative generation), sent with a
  valid key, never gets a 5xx, gets only a status the document lists, a JSON body matching the
  document's schema for that status, and a 4xx whenever the body is invalid;
- any valid body for the key's own customer reaches the harness and answers 200 with a body
  that matches `SearchResult` (the generated customer is replaced by the key's, otherwise
  almost every case would stop at the 403).
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from starlette.testclient import TestClient

from serving.api import ApiLimits, create_app
from tests.test_serving_api import CUSTOMERS, Opener, auth, indexes, issued, keys, records  # noqa: F401 (fixtures)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# Small enough for `make test` on 2 cores, large enough to reach every validation branch;
# derandomized: the same examples on every run, so a failure reproduces.
BOUNDED = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@pytest.fixture(scope="module")
def search_operation(keys, indexes):  # noqa: F811
    """`POST /v1/search` as the service documents it, loaded from the app's own /openapi.json."""
    app = create_app(keys, lambda: set(CUSTOMERS), Opener(indexes), lambda customer: "heuristic", ApiLimits(max_query_chars=300, max_k=20))
    return schemathesis.openapi.from_asgi("/openapi.json", app)["/v1/search"]["POST"]


@BOUNDED
@given(data=st.data())
def test_any_request_gets_a_documented_answer_and_never_a_server_error(data, search_operation, issued):  # noqa: F811
    mode = data.draw(st.sampled_from([GenerationMode.POSITIVE, GenerationMode.NEGATIVE]), label="mode")
    case = data.draw(search_operation.as_strategy(mode), label="case")
    case.call_and_validate(headers=auth(issued["acme"]), checks=[*CHECKS, negative_data_rejection])


@BOUNDED
@given(data=st.data())
def test_any_valid_search_for_the_keys_customer_is_answered(data, search_operation, issued):  # noqa: F811
    case = data.draw(search_operation.as_strategy(GenerationMode.POSITIVE), label="case")
    case.body = {**case.body, "customer": "acme"}
    response = case.call_and_validate(headers=auth(issued["acme"]), checks=CHECKS)
    assert response.status_code == 200, response.text


# -- what the fuzzing found, pinned as examples ------------------------------------------------


def test_the_same_app_answers_after_its_lifespan_restarts(keys, issued, indexes, records):  # noqa: F811
    app = create_app(keys, lambda: set(CUSTOMERS), Opener(indexes), lambda customer: "heuristic")
    body = {"customer": "acme", "query": records[0]["question"], "k": 2}
    for _ in range(2):  # the first lifespan's end shut the worker pool down: every later search was a 500
        with TestClient(app) as client:
            assert client.post("/v1/search", json=body, headers=auth(issued["acme"])).status_code == 200


def test_a_k_with_a_zero_fraction_is_an_integer_as_the_document_says(keys, issued, indexes, records):  # noqa: F811
    client = TestClient(create_app(keys, lambda: set(CUSTOMERS), Opener(indexes), lambda customer: "heuristic"))
    question = records[0]["question"]
    ok = client.post("/v1/search", json={"customer": "acme", "query": question, "k": 2.0}, headers=auth(issued["acme"]))
    assert ok.status_code == 200 and len(ok.json()["documents"]) <= 2
    for k in (2.5, "2", True):
        refused = client.post("/v1/search", json={"customer": "acme", "query": question, "k": k}, headers=auth(issued["acme"]))
        assert refused.status_code == 422 and refused.json()["fields"][0]["field"] == "k"
