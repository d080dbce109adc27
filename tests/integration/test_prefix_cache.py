"""The prefix cache is stated, never silent (vllm#54227: a warm cache bent throughput
2.3x and TTFT 49x): with caching on, a cold window is salted so it reuses nothing an
earlier window cached, a warm one reuses what it can, and each records its hit rate."""

from __future__ import annotations


import pytest

from runner.config import RunConfig, build_config
from runner.measure.protocol import run_window
from runner.output.console import console_line
from runner.workload.context_mix import build_prompts, load_tokenizer
from tests.conftest import compose
from tests.integration.conftest import CACHED_NAME, wait_idle

pytestmark = pytest.mark.integration


def cache_config(state: str) -> RunConfig:
    return build_config(
        compose(
            [
                # Prompts of 3 and 5 whole 128-token blocks, more of them than a window sends, so
                # a window reuses only what an earlier window cached.
                "workload.buckets=[{total_tokens:512},{total_tokens:768}]",
                "workload.max_tokens=64", "workload.prompts_per_bucket=64",
                f"workload.prefix_cache={state}", "engine.enable_prefix_caching=true",
                "search=fixed", "search.window_s=4", "search.warmup_s=1",
                f"model.served_name={CACHED_NAME}",
            ]
        )
    )  # fmt: skip


def test_cold_windows_reuse_nothing_and_warm_windows_say_they_did(prefix_cached_server) -> None:
    prompts = build_prompts(
        load_tokenizer(prefix_cached_server.model_dir), cache_config("cold").workload
    )

    def window(state: str):
        return run_window(
            prefix_cached_server, cache_config(state), prompts, 2,
            config_id="cache", run_id="cache", phase="coarse",
        )  # fmt: skip

    cold = [window("cold"), window("cold")]
    warm = [window("warm"), window("warm")]
    for result in cold:
        assert result.detail.prefix_cache == "cold"
        assert result.row.prefix_cache_hit_pct is not None
        assert result.row.prefix_cache_hit_pct < 10.0, result.row
    # The first warm window finds nothing unsalted yet; the second sends the same prompts
    # from the start, so those the first one sent are found (whole 128-token blocks, 86-91%
    # of each). How many it sends beyond them depends on the machine's pace in each window,
    # so the hit rate is only sure to be far above a cold window's.
    assert warm[1].detail.prefix_cache == "warm"
    assert warm[1].row.prefix_cache_hit_pct > 20.0, warm[1].row
    assert "prefix_cache=warm:" in console_line(warm[1].row, warm[1].detail)
    assert all(result.row.valid for result in [*cold, *warm])
    wait_idle(prefix_cached_server.base_url, 120)
