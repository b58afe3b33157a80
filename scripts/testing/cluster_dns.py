"""The cluster's DNS for scripts/k8s-e2e.sh, standing in for CoreDNS (which neither
Debian nor any registry here offers): the records of Kubernetes' DNS specification
(kubernetes/dns, docs/specification.md) that the e2e suite asks for, read from the API
server every second.

- <svc>.<ns>.svc.<zone>: A of the cluster IP; of each ready address when headless;
  CNAME of the external name (followed when it is the cluster's own).
- <hostname>.<svc>.<ns>.svc.<zone>: A of an endpoint that has a hostname.
- _<port>._<proto>.<svc>.<ns>.svc.<zone>: SRV of each named port.
- <a-b-c-d>.<ns>.pod.<zone>: A of a.b.c.d (CoreDNS's `pods insecure`, kubeadm's default).
- PTR of cluster IPs and endpoint addresses.
Anything else in the zone is NXDOMAIN; names outside it are refused (no upstream here).

usage: cluster_dns.py API_URL TOKEN_FILE CA_FILE LISTEN_IP [ZONE]; prints "ready" once
the first read is served. Needs python3-dnslib.
"""
import json
import ssl
import sys
import time
import urllib.request

from dnslib import A, CNAME, PTR, QTYPE, RCODE, RR, SOA, SRV
from dnslib.server import BaseResolver, DNSLogger, DNSServer

api, token_file, ca, listen = sys.argv[1:5]
zone = sys.argv[5] if len(sys.argv) > 5 else "cluster.local"
token = open(token_file).read().strip()
tls = ssl.create_default_context(cafile=ca)
TTL = 5


def get(path):
    req = urllib.request.Request(api + path, headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(req, context=tls, timeout=10) as r:
        return json.load(r)["items"]


def reverse(ip):
    return ".".join(reversed(ip.split("."))) + ".in-addr.arpa"


def table():
    """name -> [(type, rdata)] from the services and endpoints the API server holds."""
    records = {}

    def add(name, rtype, rdata):
        records.setdefault(name.lower(), []).append((rtype, rdata))

    endpoints = {(e["metadata"]["namespace"], e["metadata"]["name"]): e for e in get("/api/v1/endpoints")}
    for svc in get("/api/v1/services"):
        ns, name, spec = svc["metadata"]["namespace"], svc["metadata"]["name"], svc["spec"]
        fqdn = f"{name}.{ns}.svc.{zone}"
        if spec.get("type") == "ExternalName":
            add(fqdn, "CNAME", spec["externalName"].rstrip("."))
            continue
        cluster_ip = spec.get("clusterIP")
        targets = []
        if cluster_ip and cluster_ip != "None":
            add(fqdn, "A", cluster_ip)
            add(reverse(cluster_ip), "PTR", fqdn)
            targets.append(fqdn)
        else:
            for subset in endpoints.get((ns, name), {}).get("subsets") or []:
                for address in subset.get("addresses") or []:
                    add(fqdn, "A", address["ip"])
                    if address.get("hostname"):
                        host = f"{address['hostname']}.{fqdn}"
                        add(host, "A", address["ip"])
                        add(reverse(address["ip"]), "PTR", host)
                        targets.append(host)
        for port in spec.get("ports") or []:
            if port.get("name"):
                srv = f"_{port['name']}._{port.get('protocol', 'TCP').lower()}.{fqdn}"
                for target in targets or [fqdn]:
                    add(srv, "SRV", (port["port"], target))
    return records


class Resolver(BaseResolver):
    def __init__(self):
        self.records = {}

    def answers(self, name, qtype, reply, depth=0):
        """Adds the records of `name` of `qtype` (following CNAMEs); False if none exist."""
        found = self.records.get(name)
        if found is None and name.endswith(f".pod.{zone}"):
            label = name.split(".")[0].split("-")
            if len(label) == 4 and all(p.isdigit() for p in label):
                found = [("A", ".".join(label))]
        if found is None:
            return False
        for rtype, rdata in found:
            if rtype == "CNAME" and qtype != "CNAME":
                reply.add_answer(RR(name, QTYPE.CNAME, rdata=CNAME(rdata), ttl=TTL))
                if depth < 8:
                    self.answers(rdata.lower(), qtype, reply, depth + 1)
            elif rtype == qtype or qtype == "ANY":
                rd = {"A": lambda: A(rdata), "CNAME": lambda: CNAME(rdata),
                      "PTR": lambda: PTR(rdata),
                      "SRV": lambda: SRV(priority=0, weight=100, port=rdata[0], target=rdata[1])}[rtype]()
                reply.add_answer(RR(name, getattr(QTYPE, rtype), rdata=rd, ttl=TTL))
        return True

    def resolve(self, request, handler):
        reply = request.reply()
        name = str(request.q.qname).rstrip(".").lower()
        qtype = QTYPE[request.q.qtype]
        if not (name.endswith("." + zone) or name.endswith(".in-addr.arpa")):
            reply.header.rcode = RCODE.REFUSED
        elif not self.answers(name, qtype, reply):
            reply.header.rcode = RCODE.NXDOMAIN
        if not reply.rr:
            reply.add_auth(RR(zone, QTYPE.SOA, ttl=TTL, rdata=SOA(
                "ns.dns." + zone, "hostmaster." + zone, (1, 7200, 1800, 86400, TTL))))
        return reply


resolver = Resolver()
resolver.records = table()
quiet = DNSLogger("-request,-reply,-truncated", prefix=False)
for tcp in (False, True):
    DNSServer(resolver, address=listen, port=53, tcp=tcp, logger=quiet).start_thread()
print("ready", flush=True)
while True:
    time.sleep(1)
    try:
        resolver.records = table()
    except Exception as e:  # the API server restarting: keep the last table
        print(f"cluster_dns: {e}", file=sys.stderr, flush=True)
