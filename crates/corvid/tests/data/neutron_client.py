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



def refused(call, error, words):
    """`call` must fail with `error`, its message saying `words`."""
    try:
        call()
    except error as e:
        assert words in str(e), (words, str(e))
        return
    raise AssertionError("accepted, expected %s (%s)" % (error.__name__, words))


# Routers: a gateway on an external network, an interface on a subnet, extra routes.
assert "router" in {e["alias"] for e in nc.list_extensions()["extensions"]}
public = nc.create_network({"network": {"name": "public", "router:external": True}})["network"]
nc.create_subnet({"subnet": {"network_id": public["id"], "cidr": "203.0.113.0/24",
                             "ip_version": 4}})
router = nc.create_router({"router": {"name": "r1"}})["router"]
assert (router["status"], router["external_gateway_info"]) == ("ACTIVE", None), router
nc.add_gateway_router(router["id"], {"network_id": public["id"]})
gw = nc.show_router(router["id"])["router"]["external_gateway_info"]
assert gw["network_id"] == public["id"] and gw["enable_snat"], gw
assert gw["external_fixed_ips"][0]["ip_address"].startswith("203.0.113."), gw
refused(lambda: nc.add_gateway_router(router["id"], {"network_id": net["id"]}),
        nexc.BadRequest, "is not an external network")

iface = nc.add_interface_router(router["id"], {"subnet_id": sub["id"]})
assert (iface["subnet_id"], iface["id"]) == (sub["id"], router["id"]), iface
held = nc.show_port(iface["port_id"])["port"]
assert held["device_owner"] == "network:router_interface", held
assert held["fixed_ips"][0]["ip_address"] == sub["gateway_ip"], held
refused(lambda: nc.add_interface_router(router["id"], {"subnet_id": sub["id"]}),
        nexc.BadRequest, "Router already has a port on subnet %s" % sub["id"])
other = nc.create_network({"network": {"name": "nc-other"}})["network"]
inside = nc.create_subnet({"subnet": {"network_id": other["id"], "cidr": "10.60.0.128/25",
                                      "ip_version": 4}})["subnet"]
refused(lambda: nc.add_interface_router(router["id"], {"subnet_id": inside["id"]}),
        nexc.BadRequest, "overlaps with cidr 10.60.0.0/24")
bare = nc.create_subnet({"subnet": {"network_id": other["id"], "cidr": "10.62.0.0/24",
                                    "ip_version": 4, "gateway_ip": None}})["subnet"]
refused(lambda: nc.add_interface_router(router["id"], {"subnet_id": bare["id"]}),
        nexc.BadRequest, "must have a gateway IP")

route = {"destination": "192.0.2.0/24", "nexthop": "10.60.0.50"}
nc.update_router(router["id"], {"router": {"routes": [route]}})
assert nc.show_router(router["id"])["router"]["routes"] == [route]
refused(lambda: nc.update_router(router["id"], {"router": {"routes": [
    {"destination": "192.0.2.0/24", "nexthop": "10.99.0.1"}]}}),
    nexc.BadRequest, "the nexthop is not connected with router")
refused(lambda: nc.remove_interface_router(router["id"], {"subnet_id": sub["id"]}),
        nexc.Conflict, "required by one or more routes")
refused(lambda: nc.delete_router(router["id"]), nexc.Conflict, "still has ports")
refused(lambda: nc.delete_port(iface["port_id"]), nexc.Conflict,
        "cannot be deleted directly via the port API")
nc.remove_extra_routes_from_router(router["id"], {"router": {"routes": [route]}})
assert nc.show_router(router["id"])["router"]["routes"] == []
nc.remove_interface_router(router["id"], {"subnet_id": sub["id"]})
refused(lambda: nc.remove_interface_router(router["id"], {"subnet_id": sub["id"]}),
        nexc.NotFound, "has no interface on subnet")
nc.remove_gateway_router(router["id"])
assert nc.show_router(router["id"])["router"]["external_gateway_info"] is None
nc.delete_router(router["id"])
assert nc.list_routers()["routers"] == []
assert [p for p in nc.list_ports()["ports"] if p["device_owner"].startswith("network:")] == []
for s in (inside, bare):
    nc.delete_subnet(s["id"])
nc.delete_network(other["id"])
for s in nc.list_subnets(network_id=public["id"])["subnets"]:
    nc.delete_subnet(s["id"])
nc.delete_network(public["id"])

for p in nc.list_ports(network_id=net["id"])["ports"]:
    nc.delete_port(p["id"])
nc.delete_subnet(sub["id"])
nc.delete_network(net["id"])
nc.delete_subnetpool(pool["id"])
assert nc.list_networks()["networks"] == []
print("neutronclient: ok")
