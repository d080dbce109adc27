"""The typed run configuration: one object, built once from Hydra's composed config.

Every model rejects unknown keys so that YAML drift fails loudly. Nothing below the
entry point sees an OmegaConf ``DictConfig``; it sees a :class:`RunConfig`.
Cross-group rules live in :mod:`runner.prepare.validate`; this package only checks shapes.

One module per part of the config: :mod:`~runner.config.engine` (``hw``, ``image``,
``model``, ``kv``, ``engine``), :mod:`~runner.config.workload`,
:mod:`~runner.config.search` (``search``, ``slo``), :mod:`~runner.config.run` (backend,
tracking, results and :class:`RunConfig` itself) and :mod:`~runner.config.build`
(plain data to a RunConfig, or the error a user reads).
"""

from runner.config.base import Precision, Strict, url_problem
from runner.config.build import build_config, did_you_mean, known_keys, user_path
from runner.config.engine import Engine, Hardware, Image, KVCache, Model
from runner.config.run import Backend, Reference, Results, RunConfig, Smoke, Tracking
from runner.config.search import (
    SLO,
    BracketSearch,
    FixedSearch,
    Search,
    SearchBase,
    Tier,
    TierMetric,
)
from runner.config.workload import (
    Bucket,
    ChatSessionsWorkload,
    ContextMixWorkload,
    ShareGPTWorkload,
    ThinkTime,
    Workload,
    WorkloadBase,
)

__all__ = [
    "SLO",
    "Backend",
    "BracketSearch",
    "Bucket",
    "ChatSessionsWorkload",
    "ContextMixWorkload",
    "Engine",
    "FixedSearch",
    "Hardware",
    "Image",
    "KVCache",
    "Model",
    "Precision",
    "Reference",
    "Results",
    "RunConfig",
    "Search",
    "SearchBase",
    "ShareGPTWorkload",
    "Smoke",
    "Strict",
    "ThinkTime",
    "Tier",
    "TierMetric",
    "Tracking",
    "Workload",
    "WorkloadBase",
    "build_config",
    "did_you_mean",
    "known_keys",
    "url_problem",
    "user_path",
]
