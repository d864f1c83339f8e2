"""The configuration file (YAML): the delay level table and its tiers, the broker preset and the
retry/dead-letter policies, and the producer's retry settings.

A tier is a set of delay levels promoted together by one Airflow DAG every ``window``. Every level
of the table belongs to exactly one tier, so that no waiting message is left without a DAG; a
retry's wait, whatever policy computed it, is routed to the first level at least as long.
``load_config`` validates the whole file and raises ``ConfigError`` naming the bad key and value.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from redelivery.errors import ConfigError
from redelivery.rules.levels import ROCKETMQ_RETRY_LEVELS, LevelTable, parse_duration
from redelivery.rules.policies import EffectivePolicy, PolicyConfig, resolve
from redelivery.rules.standing import StandingRedrive
from redelivery.settings import get_settings

#: A tier's DAG run spans one hour of windows by default (``TierConfig.run_span``).
DEFAULT_RUN_SPAN_SECONDS = 3600
#: The longest span a DAG run may cover: one day.
MAX_RUN_SPAN_SECONDS = 86400


class TierConfig(BaseModel):
    """One tier: ``name`` (DAG id suffix), the delay ``levels`` it promotes, its ``window`` (what is
    due by a window's end is promoted at that end), and ``run_span``: how much time one scheduled
    DAG run of the tier covers, applying its windows in turn (the design card's "batched as
    windows"). ``run_span`` is a whole multiple of ``window``, at most a day; unset: 1 h (or the
    window, when longer); equal to ``window``: one DAG run per window."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=r"^[a-z0-9_]{1,40}$", description="the suffix of its DAG id, `redelivery_tier_<name>`"
    )
    levels: list[int] = Field(min_length=1, description="the delay levels it promotes")
    window: str = Field(
        description="a duration (`10s`, `1m`): what is due by a window's end is promoted at that end"
    )
    run_span: str | None = Field(
        None,
        description="the time one scheduled DAG run of the tier covers, applying its windows in turn "
        "(a whole number of windows, at most 1 day); equal to `window`: a DAG run per window",
        json_schema_extra={"default_text": "1 h (or the window, when longer)"},
    )

    @field_validator("window")
    @classmethod
    def _window_is_duration(cls, value: str) -> str:
        parse_duration(value)
        return value

    @model_validator(mode="after")
    def _span_holds_whole_windows(self) -> TierConfig:
        if self.run_span is not None:
            span = parse_duration(self.run_span, MAX_RUN_SPAN_SECONDS)
            if span % self.window_seconds:
                raise ValueError(
                    f"tier {self.name!r}: run_span {self.run_span!r} is not a whole number of its "
                    f"{self.window!r} windows"
                )
        return self

    @property
    def window_seconds(self) -> int:
        return parse_duration(self.window)

    @property
    def run_span_seconds(self) -> int:
        """The span of a scheduled DAG run in seconds: ``run_span``, else the smallest multiple of
        the window of at least an hour."""
        if self.run_span is not None:
            return parse_duration(self.run_span, MAX_RUN_SPAN_SECONDS)
        return -(-DEFAULT_RUN_SPAN_SECONDS // self.window_seconds) * self.window_seconds

    @property
    def windows_per_run(self) -> int:
        """How many windows a scheduled DAG run applies (1: a DAG run per window)."""
        return self.run_span_seconds // self.window_seconds


class ProducerConfig(BaseModel):
    """``publish`` retries of transient database failures and of flow control (530), with
    RocketMQ's send-retry backoff, gRPC's connection backoff (RocketMQ cloud, "Send retry and
    flow control"): wait min(initial * multiplier^k, max) moved by up to +-jitter of itself, for
    at most ``attempts`` tries in all."""

    model_config = ConfigDict(extra="forbid")

    initial_backoff: float = Field(default=1.0, gt=0, le=3600, description="the first wait, seconds")
    multiplier: float = Field(
        default=1.6, ge=1.0, le=100, description="each later wait is the previous x multiplier ..."
    )
    jitter: float = Field(
        default=0.2, ge=0.0, le=1.0, description="... moved by up to +- this share of itself (0.2: 20%) ..."
    )
    max_backoff: float = Field(default=120.0, gt=0, le=3600, description="... and at most this, seconds")
    attempts: int = Field(default=5, ge=1, le=100, description="tries in all; then the last error is raised")


#: The longest retention: 10 years.
MAX_RETENTION_SECONDS = 3650 * 86400
#: A partition of the log spans 1 minute to 7 days (partitions align on the UTC day).
MIN_PARTITION_SECONDS, MAX_PARTITION_SECONDS = 60, 7 * 86400


class RetentionConfig(BaseModel):
    """How long records are kept (durations: ``7d``, ``12h``), deleted by ``redelivery cleanup``
    and the ``redelivery_maintenance`` DAG.

    ``messages``: the log (RocketMQ's ``fileReservedTime``, 72 hours): a partition of the log
    (``partition`` long, PostgreSQL range partitions on the publish time) is dropped once it ended
    more than ``messages`` ago and no group still needs any of its messages (every consume offset
    past it, no unfinished delivery in it); a group that lags holds it, and says so in the metrics.
    ``dead_letters``: dead letters older than this (by dead-lettering time) are deleted; ``None``
    (the default) keeps them until they are redriven. The others: publish batch ids (a batch id
    publishes once within this time), tier run records, redrive runs with their per-message audit,
    rows staged by publishes that never finished, and settle markers (``settle_parts``: each part
    a Spark settle answered, so that a task Spark runs again within this time changes nothing
    twice; a repeat after it only meets stale receipts, counted as such).

    ``airflow_runs``: what the system's own DAGs (the tiers', ``redelivery_maintenance`` and
    ``redelivery_standing_redrives``) leave
    in Airflow: their finished DAG runs older than this, with the task instances, XComs and task
    logs of those runs, are deleted by ``redelivery_maintenance`` through Airflow's REST API (never
    another DAG's; ``redelivery.airflow.retention``); ``None`` keeps them."""

    model_config = ConfigDict(extra="forbid")

    messages: str = Field(
        "3d",
        description="the log: a partition is dropped this long after it ended, once no group needs any of "
        "its messages (RocketMQ's `fileReservedTime`, 72 h)",
    )
    partition: str = Field(
        "1h",
        description="the span of the log's partitions, ranges of publish times (1 minute to 7 days; a day "
        "is a whole number of them, or they are whole days)",
    )
    dead_letters: str | None = Field(
        None,
        description="dead letters older than this (by dead-lettering time) are deleted (each group's "
        "COMMITTED count stays); unset: kept until redriven",
    )
    publish_batches: str = Field("7d", description="publish batch ids: a batch id publishes once within it")
    tier_runs: str = Field("7d", description="tier run records (`tier_runs`, the page's tiers)")
    redrive_runs: str = Field(
        "90d", description="redrive runs, with their per-message audit, and breaker transitions"
    )
    publish_staging: str = Field("1d", description="rows staged by publishes that never finished")
    settle_markers: str = Field(
        "7d",
        description="the parts a Spark `settle` answered, so that a task Spark runs again within it "
        "changes nothing twice (a repeat after it only meets stale receipts, counted as such)",
    )
    airflow_runs: str | None = Field(
        "7d",
        description="in Airflow: the finished runs of the tier DAGs, `redelivery_maintenance` and "
        "`redelivery_standing_redrives` (their "
        "task instances, XComs and task logs), deleted by the maintenance DAG through the REST API; "
        "`null` keeps them",
    )

    @field_validator(
        "messages", "dead_letters", "publish_batches", "tier_runs", "redrive_runs", "publish_staging",
        "settle_markers", "airflow_runs",
    )  # fmt: skip
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value, MAX_RETENTION_SECONDS)
        return value

    @field_validator("partition")
    @classmethod
    def _partition_span(cls, value: str) -> str:
        seconds = parse_duration(value, MAX_PARTITION_SECONDS)
        if seconds < MIN_PARTITION_SECONDS or 86400 % seconds and seconds % 86400:
            raise ValueError(
                f"a partition spans {MIN_PARTITION_SECONDS} s to 7 days and divides a day or is whole "
                f"days (1m, 15m, 1h, 1d ...), got {value!r}"
            )
        return value

    def seconds(self, name: str) -> int | None:
        """The setting ``name`` in seconds (None: kept, for ``dead_letters`` and ``airflow_runs``)."""
        value = getattr(self, name)
        return None if value is None else parse_duration(value, MAX_RETENTION_SECONDS)


def default_tiers() -> list[TierConfig]:
    """One tier per band of the RocketMQ 5 table: seconds (10s, 30s) every 10 s, minutes (1m..10m)
    every minute, half hours (20m, 30m) every 5 minutes, hours (1h, 2h) every 10 minutes."""
    return [
        TierConfig(name="seconds", levels=[1, 2], window="10s"),
        TierConfig(name="minutes", levels=list(range(3, 13)), window="1m"),
        TierConfig(name="half_hours", levels=[13, 14], window="5m"),
        TierConfig(name="hours", levels=[15, 16], window="10m"),
    ]


class RedeliveryConfig(BaseModel):
    """The whole file; every key has a default (``config/redelivery.yaml`` spells them out).
    ``broker`` picks the defaults of the policies (RocketMQ 5 unless set)."""

    model_config = ConfigDict(extra="forbid")

    delay_levels: str = Field(
        ROCKETMQ_RETRY_LEVELS,
        description="the routing levels (RocketMQ 5's table): a retry is routed to the first level at "
        "least as long as its wait; a table that drops a level some message waits at is refused, saying "
        "how many wait there",
    )
    tiers: list[TierConfig] = Field(
        default_factory=default_tiers,
        min_length=1,
        description="one DAG each; every level in exactly one tier",
        json_schema_extra={
            "default_text": "seconds (levels 1-2, every 10s), minutes (3-12, 1m), half_hours (13-14, 5m), "
            "hours (15-16, 10m)"
        },
    )
    broker: Literal["rocketmq", "pulsar", "artemis"] = Field(
        "rocketmq", description="the defaults of every policy (Policies, below)"
    )
    policies: list[PolicyConfig] = Field(
        default_factory=list, description="retry and dead-letter policies per topic and group (below)"
    )
    producer: ProducerConfig = Field(
        default_factory=ProducerConfig, description="`publish` retries (Producer, below)"
    )
    retention: RetentionConfig = Field(
        default_factory=RetentionConfig,
        description="how long records are kept (durations: `7d`, `12h`), deleted by `redelivery "
        "cleanup` and the `redelivery_maintenance` DAG",
    )
    spark_threshold: int = Field(
        default=50_000,
        ge=0,
        description="a tier run or a redrive with at least this many messages to move runs on Spark; "
        "smaller ones move in the task itself (a Spark round trip would cost more than it saves)",
    )
    standing_redrives: list[StandingRedrive] = Field(
        default_factory=list,
        description="standing redrive policies: dead letters that come back by themselves (Standing "
        "redrives, below)",
    )
    _policy_cache: dict = PrivateAttr(default_factory=dict)

    @field_validator("standing_redrives")
    @classmethod
    def _standing_names_once(cls, value: list[StandingRedrive]) -> list[StandingRedrive]:
        names = [p.name for p in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"standing redrive names {twice} are used twice")
        return value

    @field_validator("delay_levels")
    @classmethod
    def _levels_parse(cls, value: str) -> str:
        LevelTable.parse(value)
        return value

    @model_validator(mode="after")
    def _tiers_cover_every_level_once(self) -> RedeliveryConfig:
        count = len(self.level_table)
        seen: dict[int, str] = {}
        names = set()
        for tier in self.tiers:
            if tier.name in names:
                raise ValueError(f"tier name {tier.name!r} is used twice")
            names.add(tier.name)
            for level in tier.levels:
                if not 1 <= level <= count:
                    raise ValueError(
                        f"tier {tier.name!r} lists level {level}, but the table has levels 1..{count}"
                    )
                if level in seen:
                    raise ValueError(f"level {level} is in both tier {seen[level]!r} and tier {tier.name!r}")
                seen[level] = tier.name
        missing = sorted(set(range(1, count + 1)) - set(seen))
        if missing:
            raise ValueError(
                f"levels {missing} belong to no tier: messages waiting at them would never be promoted"
            )
        return self

    @property
    def level_table(self) -> LevelTable:
        return LevelTable.parse(self.delay_levels)

    def policy_for(
        self, topic: str, group: str, group_max_reconsume_times: int | None = None
    ) -> EffectivePolicy:
        """The effective policy of ``topic`` and ``group`` (see ``redelivery.rules.policies.resolve``).
        Raises ``ConfigError`` if its DLQ or retry name cannot name a table."""
        key = (topic, group, group_max_reconsume_times)
        cache = self._policy_cache
        if key not in cache:
            try:
                cache[key] = resolve(self.policies, self.broker, topic, group, group_max_reconsume_times)
            except ValueError as exc:
                raise ConfigError(f"policy for topic {topic!r} and group {group!r}: {exc}") from exc
        return cache[key]

    def tier(self, name: str) -> TierConfig:
        """The tier called ``name``; ``ConfigError`` if there is none."""
        for tier in self.tiers:
            if tier.name == name:
                return tier
        raise ConfigError(f"unknown tier {name!r}; the configured tiers are {[t.name for t in self.tiers]}")


def _describe(error: ValidationError, path: Path) -> str:
    lines = [f"invalid configuration file {path}:"]
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        lines.append(f"  {key}: {item['msg']} (got {item.get('input')!r})")
    return "\n".join(lines)


def load_config(path: Path | str | None = None) -> RedeliveryConfig:
    """Read and validate the configuration file (default: ``REDELIVERY_CONFIG``, see settings; with
    no file at all, the defaults).

    Raises ``ConfigError`` when the file is missing, is not YAML, or fails validation."""
    path = Path(path) if path is not None else get_settings().config_path
    if path is None:
        return RedeliveryConfig()
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"configuration file {path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(
            f"configuration file {path} must be a mapping of settings, got {type(raw).__name__}"
        )
    try:
        return RedeliveryConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from exc


@lru_cache(maxsize=4)
def cached_config(path: str | None = None) -> RedeliveryConfig:
    """``load_config`` once per process and path."""
    return load_config(path)
