"""A small kpx control plane in Python: reads Services (in kpx's own terms) and node
configs from a YAML file, serves them to kpx node agents over Envoy's delta ADS, and
follows the file as it changes. It honours what proto/README.md asks of a server:
content-hash versions, one response in flight per type, ACK/NACK (NACKed content is not
sent again), removals, and resume from the versions a node already has.

usage: python3 kpx_control_plane.py --config services.yaml [--listen 127.0.0.1:18000]
"""
import argparse
import hashlib
import json
import os
import pathlib
import queue
import sys
import threading
import time
from concurrent import futures

import grpc
import yaml
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2

HERE = pathlib.Path(__file__).resolve().parent
if not (HERE / "generated" / "kpx" / "v1" / "kpx_pb2.py").exists():
    import build

    build.build()
sys.path.insert(0, str(HERE / "generated"))
from kpx.v1 import kpx_pb2  # noqa: E402

SERVICE_VIEW = "type.googleapis.com/kpx.v1.ServiceView"
NODE_CONFIG = "type.googleapis.com/kpx.v1.NodeConfig"
PROTOCOLS = {"TCP": kpx_pb2.TCP, "UDP": kpx_pb2.UDP, "SCTP": kpx_pb2.SCTP}


LOG_LOCK = threading.Lock()


def log(message, **fields):
    """One JSON object per line on stderr (whole lines, whichever thread writes)."""
    with LOG_LOCK:
        sys.stderr.write(json.dumps({"message": message, **fields}) + "\n")
        sys.stderr.flush()


def service_view(s):
    """One ServiceView from the YAML's terms; nothing is checked here: the node does."""
    view = kpx_pb2.ServiceView(
        cluster=s.get("cluster", "py"), namespace=s["namespace"], name=s["name"],
        cluster_ips=s.get("clusterIPs", []), external_ips=s.get("externalIPs", []))
    for p in s.get("ports") or []:
        port = view.ports.add(name=p.get("name", ""), protocol=PROTOCOLS[p.get("protocol", "TCP")],
                              port=p["port"], node_port=p.get("nodePort", 0))
        for e in p.get("endpoints") or []:
            port.endpoints.add(address=e["address"], port=e["port"], node_name=e.get("node", ""))
    return view


def load(path):
    """name → (version, Any) per type URL, from the YAML file."""
    with open(path) as f:
        doc = yaml.safe_load(f) or {}
    views = {}
    for s in doc.get("services") or []:
        view = service_view(s)
        views[f"{view.cluster}/{view.namespace}/{view.name}"] = pack(SERVICE_VIEW, view)
    configs = {}
    for n in doc.get("nodes") or []:
        config = kpx_pb2.NodeConfig(name=n["name"], addresses=n.get("addresses", []),
                                    pod_cidrs=n.get("podCIDRs", []), zone=n.get("zone", ""))
        configs[n["name"]] = pack(NODE_CONFIG, config)
    return {SERVICE_VIEW: views, NODE_CONFIG: configs}


def pack(type_url, message):
    body = message.SerializeToString(deterministic=True)
    # A content hash: the same content gets the same version on every run.
    return hashlib.sha256(body).hexdigest()[:32], any_pb2.Any(type_url=type_url, value=body)


class State:
    """The file's content, and the streams to wake when it changes."""

    def __init__(self, path):
        self.path, self.lock, self.streams = path, threading.Lock(), []
        self.resources = load(path)
        threading.Thread(target=self.follow, daemon=True).start()

    def follow(self):
        seen = os.stat(self.path).st_mtime_ns
        while True:
            time.sleep(0.25)
            try:
                now = os.stat(self.path).st_mtime_ns
                if now == seen:
                    continue
                resources, seen = load(self.path), now
            except Exception as e:  # a half-written or wrong file must not stop serving
                log("cannot read the file; keeping what was served", error=str(e))
                continue
            with self.lock:
                self.resources = resources
                for events in self.streams:
                    events.put(("changed", None))
            log("file read", services=len(resources[SERVICE_VIEW]))

    def wanted(self, type_url, node):
        with self.lock:
            resources = self.resources[type_url]
        if type_url == NODE_CONFIG:
            return {n: r for n, r in resources.items() if n == node}
        return dict(resources)


class Subscription:
    """What one node has of one type, and what is on the way to it."""

    def __init__(self, initial):
        self.has = dict(initial)  # name → version the node holds
        self.in_flight = None     # (nonce, {name: version or None for a removal})
        self.rejected = {}        # name → version the node refused

    def next_response(self, type_url, wanted, nonce):
        if self.in_flight is not None:
            return None
        send = {n: r for n, r in wanted.items()
                if self.has.get(n) != r[0] and self.rejected.get(n) != r[0]}
        gone = [n for n in self.has if n not in wanted]
        if not send and not gone:
            return None
        response = discovery_pb2.DeltaDiscoveryResponse(type_url=type_url, nonce=nonce, removed_resources=gone)
        for name, (version, body) in sorted(send.items()):
            response.resources.add(name=name, version=version, resource=body)
        self.in_flight = (nonce, {**{n: v for n, (v, _) in send.items()}, **{n: None for n in gone}})
        return response

    def answered(self, nonce, error):
        if self.in_flight is None or self.in_flight[0] != nonce:
            return False  # a stale nonce: ignored
        sent, self.in_flight = self.in_flight[1], None
        for name, version in sent.items():
            if error is not None:
                if version is not None:
                    self.rejected[name] = version
            elif version is None:
                self.has.pop(name, None)
            else:
                self.has[name] = version
        return True


class Ads(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self, state):
        self.state, self.nonces, self.nonce_lock = state, 0, threading.Lock()

    def nonce(self):
        with self.nonce_lock:
            self.nonces += 1
            return str(self.nonces)

    def DeltaAggregatedResources(self, requests, context):
        # Headers now, so the node counts itself connected before the first response.
        context.send_initial_metadata(())
        events = queue.Queue()

        def read():
            try:
                for request in requests:
                    events.put(("request", request))
            finally:
                events.put(("closed", None))

        threading.Thread(target=read, daemon=True).start()
        with self.state.lock:
            self.state.streams.append(events)
        node, subscriptions = None, {}
        try:
            while True:
                kind, request = events.get()
                if kind == "closed":
                    return
                if kind == "request":
                    node = node or request.node.id
                    type_url = request.type_url
                    if type_url not in subscriptions:
                        subscriptions[type_url] = Subscription(request.initial_resource_versions)
                        log("subscribed", node=node, type_url=type_url,
                            has=len(request.initial_resource_versions))
                    elif request.response_nonce:
                        error = request.error_detail.message if request.HasField("error_detail") else None
                        if subscriptions[type_url].answered(request.response_nonce, error):
                            log("NACK" if error else "ACK", node=node, type_url=type_url,
                                nonce=request.response_nonce, error=error)
                for type_url in (NODE_CONFIG, SERVICE_VIEW):
                    if type_url not in subscriptions:
                        continue
                    response = subscriptions[type_url].next_response(
                        type_url, self.state.wanted(type_url, node), self.nonce())
                    if response is not None:
                        log("sending", node=node, type_url=type_url, nonce=response.nonce,
                            resources=len(response.resources), removed=len(response.removed_resources))
                        yield response
        finally:
            with self.state.lock:
                self.state.streams.remove(events)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="the YAML file of services and nodes")
    parser.add_argument("--listen", default="127.0.0.1:18000")
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(Ads(State(args.config)), server)
    server.add_insecure_port(args.listen)
    server.start()
    log("serving delta ADS", listen=args.listen)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
