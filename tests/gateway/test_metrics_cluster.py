"""`cluster-local`'s metrics: the Temporal dev server's own and each worker's
(POSTTRAIN_WORKER_METRICS_PORT) are served where the command says, and a worker's log says
where its endpoint is."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.production import cluster_config, cluster_environment, start_cluster
from tests.waiting import PROGRESS_S, eventually


async def test_the_cluster_serves_temporal_and_worker_metrics_where_it_says(
    tmp_path: Path,
) -> None:
    state = tmp_path / "cluster"
    config = cluster_config(state, cluster_environment(state), gateways=1, workers=1)
    cluster = await start_cluster(config)
    try:
        described = "\n".join(cluster.describe())
        temporal_url = f"http://127.0.0.1:{cluster.temporal_metrics_port}/metrics"
        (worker,) = cluster.workers
        assert temporal_url in described and f"{worker.url}" in described
        async with httpx.AsyncClient(timeout=10) as http:
            temporal = await http.get(temporal_url)
            assert temporal.status_code == 200 and "persistence_requests" in temporal.text

            async def worker_reads_visibility() -> bool:
                assert worker.url is not None
                found = {
                    (sample.name, tuple(sorted(sample.labels.items()))): sample.value
                    for family in text_string_to_metric_families((await http.get(worker.url)).text)
                    for sample in family.samples
                }
                return (
                    found.get(("posttrain_worker_info", (("backend", "fake"),))) == 1
                    and found.get(("posttrain_visibility_last_success_timestamp_seconds", ()), 0)
                    > 0
                    and found.get(("posttrain_episodes", (("state", "running"),))) == 0
                )

            await eventually(worker_reads_visibility, PROGRESS_S, "the worker's visibility gauges")
        assert f"worker metrics: {worker.url}" in worker.log_since_start()
        # The worker runs its full garbage collections on its own schedule (the default).
        assert "full garbage collections every 600 s" in worker.log_since_start()
    finally:
        await cluster.stop()
