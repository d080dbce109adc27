"""Credentials in URLs never reach anything runner shows or stores (issue 8)."""

from __future__ import annotations

import logging

import pytest

from runner.secret import RedactingFilter, has_credentials, is_env_name, redact, redact_data


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://user:hunter2@mlflow.lan:5000", "http://***@mlflow.lan:5000"),
        ("https://tok3n@host/api", "https://***@host/api"),
        ("postgresql://runner:hunter2@db/mlflow", "postgresql://***@db/mlflow"),
        ("http://[::1]:8000/v1?token=hunter2&x=1", "http://[::1]:8000/v1?token=***&x=1"),
        ("https://s3/bucket/f?X-Amz-Signature=hunter2", "https://s3/bucket/f?X-Amz-Signature=***"),
        ("http://h/p?api_key=hunter2#top", "http://h/p?api_key=***#top"),
        ("http://[::1", "http://[::1"),  # malformed, but nothing to hide
    ],
)
def test_a_url_keeps_its_host_and_loses_its_credentials(text: str, shown: str) -> None:
    assert redact(text) == shown
    assert "hunter2" not in redact(text) and "tok3n" not in redact(text)


def test_urls_inside_prose_are_redacted_and_the_rest_kept() -> None:
    message = (
        "The MLflow server at http://a:hunter2@h:5000 does not answer (connect to "
        "http://a:hunter2@h:5000/health refused); sqlite:///mlruns/mlflow.db is fine."
    )
    shown = redact(message)
    assert "hunter2" not in shown
    assert shown.count("http://***@h:5000") == 2 and "sqlite:///mlruns/mlflow.db" in shown
    assert redact("no url here: key=value") == "no url here: key=value"
    assert has_credentials(message) and not has_credentials(shown)


def test_nested_values_are_redacted_where_they_sit() -> None:
    data = {
        "tracking": {"uri": "http://u:hunter2@h"},
        "args": ["--x", "http://h?token=hunter2"],
        "n": 3,
    }
    assert redact_data(data) == {
        "tracking": {"uri": "http://***@h"},
        "args": ["--x", "http://h?token=***"],
        "n": 3,
    }


def test_log_records_lose_credentials_whoever_logs_them() -> None:
    record = logging.LogRecord(
        "mlflow", logging.INFO, __file__, 1, "GET %s failed", ("http://u:hunter2@h/x",), None
    )
    assert RedactingFilter().filter(record)
    assert record.getMessage() == "GET http://***@h/x failed"


@pytest.mark.parametrize("name", ["VLLM_API_KEY", "HF_TOKEN", "_X1"])
def test_variable_names_have_the_shape_of_names(name: str) -> None:
    assert is_env_name(name)


@pytest.mark.parametrize("value", ["sk-live-0123", "hf abc", "1ABC", "", "a" * 200])
def test_keys_do_not_have_the_shape_of_a_variable_name(value: str) -> None:
    assert not is_env_name(value)
