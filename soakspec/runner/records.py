"""The request record now lives in the evidence layer (`soakspec.evidence.record`): one type
the runner writes, `verify` validates and the judge reads. Re-exported here so the runner's
modules (and the clients other work edits) keep importing it from where they always did."""

from soakspec.evidence.record import (  # noqa: F401
    ERROR_LIMIT,
    FOLLOW_UP_BUCKET,
    OPTIONAL_KEYS,
    RECORD_KEYS,
    WARMUP_BUCKET,
    ItlSource,
    Outcome,
    Record,
    RequestRecord,
    TokensSource,
)
