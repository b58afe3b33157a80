"""Drives a corvid controller with python-neutronclient, the client kuryr-libnetwork and
many Neutron scripts use: it appends .json to every path, maps error types to its own
exceptions and probes extensions. Exits non-zero on the first surprise."""
import sys
import warnings

warnings.simplefilter("ignore")
from neutronclient.common import exceptions as nexc  # noqa: E402
from neutronclient.v2_0 import client  # noqa: E402

url, token = sys.argv[1], sys.argv[2]
nc = client.Client(endpoint_url=url, token=token, auth_strategy="noauth")

assert nc.show_extension("subnet_allocation")["extension"]["alias"] == "subnet_allocation"
try:
    client.Client(endpoint_url=url, token="wrong", auth_strategy="noauth").list_networks()
    raise AssertionError("a wrong token was accepted")
except nexc.Unauthorized:
    pass

net = nc.create_network({"network": {"name": "nc-net"}})["network"]
pool = nc.create_subnetpool(
    {"subnetpool": {"name": "p", "prefixes": ["10.60.0.0/16"], "default_prefixlen": 24}}
)["subnetpool"]
sub = nc.create_subnet(
    {"subnet": {"network_id": net["id"], "subnetpool_id": pool["id"], "ip_version": 4}}
)["subnet"]
assert (sub["cidr"], sub["gateway_ip"]) == ("10.60.0.0/24", "10.60.0.1"), sub

port = nc.create_port(
    {"port": {"network_id": net["id"], "device_id": "c1", "device_owner": "kuryr:container",
              "binding:host_id": "h1"}}
)["port"]
ip = port["fixed_ips"][0]["ip_address"]
assert port["status"] == "DOWN", port
nc.add_tag("ports", port["id"], "docker-endpoint")
found = nc.list_ports(device_id="c1", tags="docker-endpoint")["ports"]
assert [p["id"] for p in found] == [port["id"]], found
assert len(nc.list_ports(fixed_ips=["ip_address=%s" % ip])["ports"]) == 1
nc.update_port(port["id"], {"port": {"name": "renamed"}})
assert nc.show_port(port["id"])["port"]["name"] == "renamed"
assert len(nc.create_port({"ports": [{"network_id": net["id"]}] * 2})["ports"]) == 2

try:
    nc.create_port({"port": {"network_id": net["id"], "fixed_ips": [{"ip_address": ip}]}})
    raise AssertionError("a taken address was handed out twice")
except nexc.IpAddressAlreadyAllocatedClient:
    pass
try:
    nc.show_port("00000000-0000-0000-0000-000000000000")
    raise AssertionError("an unknown port was found")
except nexc.PortNotFoundClient:
    pass
try:
    nc.delete_network(net["id"])
    raise AssertionError("a network with ports was deleted")
except nexc.NetworkInUseClient:
    pass

for p in nc.list_ports(network_id=net["id"])["ports"]:
    nc.delete_port(p["id"])
nc.delete_subnet(sub["id"])
nc.delete_network(net["id"])
nc.delete_subnetpool(pool["id"])
assert nc.list_networks()["networks"] == []
print("neutronclient: ok")
