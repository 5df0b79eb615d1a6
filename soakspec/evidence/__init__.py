"""Evidence: everything a run writes so that a later reader can trust it.

The directory layout (the contract between the runner, the judge and `soakspec verify`)::

    <out>/<run_id>/
      manifest.json            written at start (status "running"), rewritten at the end
      manifest.json.sig        optional: its SSH signature (`run --sign KEY`; not an artifact)
      results.json             per-backend summaries
      verdict.json             the judge's output
      .lock                    held (fcntl.flock) while a run writes
      backends/<safe_name>/requests.jsonl.gz one record per finished request (`record.Record`),
                                             gzip, one member per bucket
      backends/<safe_name>/buckets.jsonl     one line per closed bucket, written during the run
      backends/<safe_name>/telemetry.jsonl
      backends/<safe_name>/traces.jsonl.gz   server traces observed during this run (gzip; rows
                                             of log traces point into server.log by offset)
      backends/<safe_name>/server.log.gz     stdout+stderr of the server, the run's secrets masked, capped and gzipped
                                             when the run ends (`serverlog`); `server.log` while
                                             it runs and after a run killed before it ended
      backends/<safe_name>/followup.json

Modules: `record` (THE request record), `buckets`, `serverlog`, `layout` (paths, `safe_name`),
`io` (atomic JSON, JSONL and gzip JSONL, the run lock, hashing),
`schema` (the shipped JSON Schemas), `manifest`, `provenance`, `redact`, `runtime`, `traces`,
`telemetry`, `netpath` (how a server was reached: the loopback test, `port_listener.via`), `verify` and `signing` (runs `ssh-keygen`). Nothing here imports trio; everything
except telemetry sampling and signing is pure or plain synchronous file I/O. This package `__init__` imports nothing, so the compiler can
use `soakspec.evidence.runtime.is_generic_label` cheaply.
"""
