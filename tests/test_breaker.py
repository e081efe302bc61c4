"""runner.execute.breaker on its own: when failed connections and 404s stop a run (the runs
themselves are in tests/test_hardening.py, in subprocesses)."""

from __future__ import annotations

from runner.errors import APIError, ConnectError, RequestError
from runner.execute.breaker import CONNECT_FAILURES, NOT_FOUND, Breaker

REFUSED = ConnectError("cannot connect to 127.0.0.1:9 (connection refused)", kind="connection")
UNKNOWN = ConnectError("cannot connect to nowhere:80 (unknown host)", kind="connection")


def _404(detail: str = "model not found") -> APIError:
    return RequestError(f"404: {detail}", status=404, detail=detail)


def test_a_model_that_never_answered_stops_once_its_replica_failed_to_connect_enough() -> None:
    breaker = Breaker({"m": ["http://a/v1"]}, {"m": "judge"})
    for _ in range(CONNECT_FAILURES - 1):
        assert breaker.connect_failed("m", "http://a/v1", REFUSED) is None
    assert breaker.connect_failed("m", "http://a/v1", REFUSED) == (
        "cannot connect to http://a/v1 (connection refused): is the server running? (model m; "
        "check --base-url / base_url)")


def test_a_fleet_stops_only_when_every_replica_is_down() -> None:
    breaker = Breaker({"m": ["http://a/v1", "http://b/v1"]}, {"m": "judge"})
    for _ in range(CONNECT_FAILURES + 2):  # one replica down: the other may still answer
        assert breaker.connect_failed("m", "http://a/v1", REFUSED) is None
    for _ in range(CONNECT_FAILURES - 1):
        assert breaker.connect_failed("m", "http://b/v1", UNKNOWN) is None
    assert breaker.connect_failed("m", "http://b/v1", UNKNOWN) == (
        "cannot connect to any endpoint of model m (http://a/v1: connection refused; "
        "http://b/v1: unknown host): are the servers running?")


def test_a_model_that_answered_once_is_never_stopped_here() -> None:
    breaker = Breaker({"m": ["http://a/v1"], "n": ["http://a/v1"]}, {"m": "judge", "n": "j2"})
    breaker.succeeded("m")
    for _ in range(2 * max(CONNECT_FAILURES, NOT_FOUND)):
        assert breaker.connect_failed("m", "http://a/v1", REFUSED) is None
        assert breaker.not_found("m", "http://a/v1", _404()) is None
    # another model of the same server is judged on its own
    for _ in range(CONNECT_FAILURES - 1):
        assert breaker.connect_failed("n", "http://a/v1", REFUSED) is None
    assert breaker.connect_failed("n", "http://a/v1", REFUSED) is not None


def test_identical_404s_stop_the_run_and_nothing_else_does() -> None:
    breaker = Breaker({"m": ["http://a/v1"]}, {"m": "gpt-5x"})
    for _ in range(NOT_FOUND + 1):  # other statuses never count, however many
        assert breaker.not_found("m", "http://a/v1", RequestError("400: bad", status=400,
                                                                  detail="bad")) is None
    for n in range(NOT_FOUND - 1):  # 404s of different details are not one fault yet
        assert breaker.not_found("m", "http://a/v1", _404(f"other {n}")) is None
        assert breaker.not_found("m", "http://a/v1", _404()) is None
    assert breaker.not_found("m", "http://a/v1", _404()) == (
        "the server at http://a/v1 has no model 'gpt-5x' (HTTP 404: model not found); check "
        "--model / base_url (an OpenAI-compatible base URL ends in /v1)")


def test_a_detail_without_a_cause_in_brackets_is_named_whole() -> None:
    odd = ConnectError("socket closed", kind="connection")
    breaker = Breaker({"m": ["http://a/v1"]}, {"m": "judge"})
    for _ in range(CONNECT_FAILURES):
        message = breaker.connect_failed("m", "http://a/v1", odd)
    assert message is not None and message.startswith("cannot connect to http://a/v1 (socket "
                                                      "closed): ")
