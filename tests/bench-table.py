#!/usr/bin/env python3
"""Turns the JSON of tests/bench-scale.sh (--json PATH) into the documentation's tables.

usage: tests/bench-table.py SCALE.json [MORE.json …] [--into FILE …]

Several JSON files (runs of the benchmark with different --skip) are read as one, the
earlier's parts winning. Without --into it prints the whole table; with it (repeatable),
it replaces, in each FILE, what stands between <!-- bench-scale:begin --> and
<!-- bench-scale:end --> with the whole table and what stands between
<!-- bench-headline:begin --> and <!-- bench-headline:end --> with the headline figures,
so the figures of docs/performance.md and README.md are the benchmark's, never copied
by hand:

    tests/bench-table.py scale.json --into docs/performance.md --into README.md
"""
import json
import sys


def cpu(f):
    """The control plane's CPU per change, and what of it is beyond its idle rate."""
    text = f"{f['controlplane_cpu_s_per_change']:.3f} CPU s"
    if "controlplane_cpu_s_per_change_beyond_idle" in f:
        text += (f" in the change's {f['change_window_ms']:.0f} ms, {f['controlplane_cpu_s_per_change_beyond_idle']:.3f}"
                 f" beyond the idle rate ({f['controlplane_idle_cpu_s_per_s'] * 1000:.0f} ms/s)")
    return text


def fanout_rows(f, label):
    n = f"{f['nodes']:,}"
    yield (f"one endpoint change → all {n} nodes{label} (after the first has it)",
           f"p50 {f['change_p50_ms']} ms, p99 {f['change_p99_ms']} ms; {cpu(f)}")
    if "initial_sync_fast_s" in f:
        per_node = f["initial_sync_wire_bytes"] / 1e6 / max(1, f["nodes"] * (100 - f.get("stuck_percent", 0)) // 100)
        yield (f"initial sync of all {n} nodes{label}: every node that ACKs at once / every node (slow ones "
               f"wait 2 s before each ACK of up to {f['initial_sync_responses_per_node']} responses)",
               f"{f['initial_sync_fast_s']:.1f} s / {f['initial_sync_all_s']:.1f} s; "
               f"{f['initial_sync_wire_bytes'] / 1e9:.1f} GB on the wire ({per_node:.2f} MB per node)")
    else:
        yield (f"initial sync of all {n} nodes{label}", f"{f['initial_sync_all_s']:.0f} s")
    heap = f.get("controlplane_heap_kib_per_stream")
    if heap:
        yield (f"control plane memory per connected node{label}: RSS / the allocator's account "
               "(allocated by the program, in active pages)",
               f"{f['controlplane_kib_per_stream']:.1f} KiB / {heap['allocated']:.1f} KiB allocated, "
               f"{heap['active']:.1f} KiB active")
    else:
        yield (f"control plane RSS per connected node{label}", f"{f['controlplane_kib_per_stream']:.1f} KiB")


def table(data):
    rows = []
    f = data.get("fanout")
    if f:
        rows.append((f"control plane: {f['services']:,} Services × {f['endpoints']} endpoints, "
                     f"{f['nodes']:,} simulated nodes ({f['slow_percent']} % slow)", ""))
        rows.extend(fanout_rows(f, ""))
    t = data.get("fanout_tls")
    if t:
        rows.extend(fanout_rows(t, " over mutual TLS"))
    fl = data.get("fanout_floor")
    if fl:
        n = f"{fl['nodes']:,}"
        rows.append((f"the transport alone (ads_floor: the control plane's gRPC/HTTP/2 stack and settings, "
                     f"one resource per change, no views, snapshots or node state), {n} nodes, every one "
                     f"ACKing at once", ""))
        rows.append((f"one change → all {n} nodes, the transport alone (after the first has it)",
                     f"p50 {fl['change_p50_ms']} ms, p99 {fl['change_p99_ms']} ms; {cpu(fl)}"))
        rows.append((f"RSS per connected node, the transport alone", f"{fl['controlplane_kib_per_stream']:.1f} KiB"))
    for b in data.get("node_programming", []):
        what = (f"node agent, {b['backend']}, {b['services']:,} Services × {b['endpoints_per_service']} "
                f"distinct endpoints")
        rows.append((f"{what}: one endpoint change, delta received → kernel committed / → kernel and "
                     f"sled committed (the ACK), {b['changes']} changes",
                     f"p50 {b.get('change_to_kernel_p50_ms', '?')} / {b['change_p50_ms']} ms, "
                     f"p99 {b.get('change_to_kernel_p99_ms', '?')} / {b['change_p99_ms']} ms"))
        if b.get("rewrite_s") is not None:
            accounted = b.get("restart_accounted_after_s")
            after = f" (bookkeeping {accounted:.2f} s more, off its path)" if accounted is not None else ""
            rows.append((f"{what}: restart over an intact table (the agent's full sync) / full rewrite (its "
                         f"table deleted) / initial sync (start → last Service)",
                         f"{b['restart_s']:.3f} s{after} / {b['rewrite_s']:.2f} s / "
                         f"{b['initial_sync_pipeline_s']:.2f} s"))
            rows.append((f"{what}: elements written by a restart over an intact table / by a full rewrite; "
                         f"requests failed across the restart",
                         f"{b['restart_elements_written']:,} / {b['rewrite_elements_written']:,}; "
                         f"{b.get('restart_requests_failed', '?')} of {b.get('restart_requests_sent', '?')}"))
            rows.append((f"{what}: agent RSS, peak (initial sync and changes) / steady / peak of a restart "
                         f"over an intact table / peak of a full rewrite",
                         f"{b['agent_peak_rss_mib']:.0f} / {b['agent_steady_rss_mib']:.0f} / "
                         f"{b['restart_peak_rss_mib']:.0f} / {b['rewrite_peak_rss_mib']:.0f} MiB"))
        else:
            rows.append((f"{what}: full sync (restarted over its store) / initial sync (start → last Service)",
                         f"{b['full_sync_s']:.2f} s / {b['initial_sync_pipeline_s']:.2f} s"))
            rows.append((f"{what}: agent RSS, peak (initial sync and changes) / steady / peak of a full sync",
                         f"{b['agent_peak_rss_mib']:.0f} / {b['agent_steady_rss_mib']:.0f} / "
                         f"{b.get('agent_full_sync_peak_rss_mib', float('nan')):.0f} MiB"))
        c = b.get("rewrite_compared")
        if c:
            commit = c["baseline_commit"]
            rows.append((f"{what}: full rewrite by this build / by {commit}'s agent, median of "
                         f"{c['rewrites_each']} each (alternating, one run): time; the Services rendered and "
                         f"encoded into the transaction (`render_ms`)",
                         f"{c['rewrite_s']:.2f} / {c['baseline_rewrite_s']:.2f} s; {c['render_ms']} / "
                         f"{c['baseline_render_ms']} ms ({c['render_ratio']:.2f} of {commit}'s)"))
        rows.append((f"{what}: TCP connect to the first vs the last Service",
                     f"{b['connect_first_us']} vs {b['connect_last_us']} µs"))
    api = data.get("api")
    if api:
        rows.append((f"one endpoint change through the Kubernetes API, {api['services']:,} Services × "
                     f"{api['endpoints_per_service']}: EndpointSlice replaced in an API server (the tests' "
                     f"list/watch server) → node agent's kernel committed, {api['changes']} changes",
                     f"p50 {api['api_to_kernel_p50_ms']} ms, p99 {api['api_to_kernel_p99_ms']} ms"))
    mcs = data.get("mcs")
    if mcs:
        rows.append((f"Multi-Cluster Services: one Service exported by {mcs['clusters']} clusters (each an API "
                     f"server of the tests' list/watch), {mcs['endpoints']:,} endpoints in slices of "
                     f"{mcs['endpoints_per_slice']}, kpx the MCS controller: control plane started → "
                     f"ServiceImports written / every endpoint in a node's kernel",
                     f"{mcs['imports_written_ms']} ms / {mcs['all_endpoints_programmed_ms']} ms"))
        rows.append((f"Multi-Cluster Services, the same export: one endpoint changed in an EndpointSlice of "
                     f"any of the clusters → the node's kernel committed the import's view, {mcs['changes']} "
                     f"changes", f"p50 {mcs['change_to_kernel_p50_ms']} ms, p99 "
                     f"{mcs['change_to_kernel_p99_ms']} ms, max {mcs['change_to_kernel_max_ms']} ms"))
    vm = data.get("ipvs_vm")
    if vm:
        by = {b["backend"]: b for b in vm["backends"]}
        ipvs = by.get("ipvs")
        others = [b for name, b in sorted(by.items()) if name != "ipvs"]
        if ipvs:
            against = "; ".join(f"{b['backend']} p50 {b['change_p50_ms']} ms, p99 {b['change_p99_ms']} ms"
                                for b in others)
            rows.append((f"IPVS, {vm['services']:,} Services × 10 endpoints, in the test VM (emulated; "
                         f"nftables in the same run): one endpoint change, {vm['changes']} changes",
                         f"p50 {ipvs['change_p50_ms']} ms, p99 {ipvs['change_p99_ms']} ms; against {against}"))
            if ipvs.get("restart_ms") is not None:
                rows.append((f"IPVS, {vm['services']:,} Services × 10 endpoints, in the test VM: full sync from "
                             "nothing / a restart's full sync over its own rules (virtual services, sets and "
                             "chains compared, only what differs written)",
                             f"{ipvs['full_sync_ms'] / 1000:.1f} s / {ipvs['restart_ms'] / 1000:.1f} s"))
    out = ["| what | measured |", "|---|---|"]
    out.extend(f"| {what} | {value} |" for what, value in rows)
    m = data.get("machine", {})
    if m:
        out.append("")
        commands = " and ".join(f"`{c}`" for c in data.get("commands", [data.get("command", "sudo tests/bench-scale.sh")]))
        out.append(f"Measured with {commands} on {m.get('cores')} cores, "
                   f"{m.get('memory_gib'):.0f} GiB, Linux {m.get('kernel')}, {m.get('nft')}.")
    return "\n".join(out) + "\n"


def headline(data):
    """The few figures the README leads with: what one node and the control plane cost."""
    rows = []
    for b in data.get("node_programming", []):
        if b["backend"] != "nftables":
            continue
        what = f"{b['services']:,} Services × {b['endpoints_per_service']} endpoints"
        rows.append((f"node agent (nftables), {what}: initial sync / agent RSS, peak and steady",
                     f"{b['initial_sync_pipeline_s']:.1f} s / {b['agent_peak_rss_mib']:.0f} and "
                     f"{b['agent_steady_rss_mib']:.0f} MiB"))
        rows.append((f"node agent (nftables), {what}: one endpoint change, received → kernel committed, p50 "
                     f"/ p99", f"{b.get('change_to_kernel_p50_ms', '?')} / {b.get('change_to_kernel_p99_ms', '?')} ms"))
        if b.get("rewrite_s") is not None:
            rows.append((f"node agent (nftables), {what}: restart over an intact table / full rewrite",
                         f"{b['restart_s']:.3f} s, {b['restart_elements_written']:,} elements written / "
                         f"{b['rewrite_s']:.2f} s, {b['rewrite_elements_written']:,}"))
    f = data.get("fanout")
    if f:
        rows.append((f"control plane, {f['services']:,} Services × {f['endpoints']} endpoints, {f['nodes']:,} "
                     f"nodes: one endpoint change → every node, p50", f"{f['change_p50_ms']} ms"))
        rows.append((f"control plane: memory per connected node", f"{f['controlplane_kib_per_stream']:.1f} KiB"))
    mcs = data.get("mcs")
    if mcs:
        rows.append((f"Multi-Cluster Services, one Service exported by {mcs['clusters']} clusters, "
                     f"{mcs['endpoints']:,} endpoints: an endpoint change in any cluster → a node's kernel, "
                     f"p50 / max", f"{mcs['change_to_kernel_p50_ms']} / {mcs['change_to_kernel_max_ms']} ms"))
    out = ["| what | measured |", "|---|---|"]
    out.extend(f"| {what} | {value} |" for what, value in rows)
    m = data.get("machine", {})
    if m:
        out.append("")
        out.append(f"On {m.get('cores')} cores, {m.get('memory_gib'):.0f} GiB, Linux {m.get('kernel')}.")
    return "\n".join(out) + "\n"


def fill(path, parts):
    """Replaces, in the file at `path`, each marked part it has; whether it had one."""
    with open(path) as f:
        text = f.read()
    found = False
    for name, content in parts.items():
        begin, end = f"<!-- {name}:begin -->\n", f"<!-- {name}:end -->"
        head, _, rest = text.partition(begin)
        if not rest:
            continue
        _, _, tail = rest.partition(end)
        text = head + begin + content + end + tail
        found = True
    if found:
        with open(path, "w") as f:
            f.write(text)
    return found


def main():
    args = sys.argv[1:]
    into = []
    while len(args) >= 2 and args[-2] in ("--into", "--readme"):
        into.insert(0, args[-1])
        args = args[:-2]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    data = {}
    for path in args:
        with open(path) as f:
            run = json.load(f)
        taken = [key for key in run if key not in data and key not in ("command", "machine")]
        for key in taken:
            data[key] = run[key]
        if taken:
            data.setdefault("commands", []).append(run.get("command", "sudo tests/bench-scale.sh"))
            data.setdefault("machine", run.get("machine", {}))
    text = table(data)
    parts = {"bench-scale": text, "bench-headline": headline(data)}
    for path in into:
        if not fill(path, parts):
            print(f"{path} has no <!-- bench-scale:begin --> or <!-- bench-headline:begin --> marker", file=sys.stderr)
            return 1
    if not into:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
