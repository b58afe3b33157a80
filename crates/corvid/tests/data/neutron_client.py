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

# Security groups: the project's default group, a group of its own with rules, ports with
# and without port security.
aliases = {e["alias"] for e in nc.list_extensions()["extensions"]}
assert {"security-group", "port-security", "allowed-address-pairs"} <= aliases, aliases
default = [g for g in nc.list_security_groups()["security_groups"] if g["name"] == "default"]
assert len(default) == 1 and len(default[0]["security_group_rules"]) == 4, default
default = default[0]
sg = nc.create_security_group({"security_group": {"name": "nc-web", "description": "web"}})[
    "security_group"]
assert sg["stateful"] is True and len(sg["security_group_rules"]) == 2, sg
nc.update_security_group(sg["id"], {"security_group": {"name": "nc-www"}})
assert nc.show_security_group(sg["id"])["security_group"]["name"] == "nc-www"
refused(lambda: nc.create_security_group({"security_group": {"name": "default"}}),
        nexc.Conflict, "Default security group already exists.")
http = {"security_group_id": sg["id"], "direction": "ingress", "protocol": "tcp",
        "port_range_min": 80, "port_range_max": 80, "remote_ip_prefix": "192.0.2.0/24"}
rule = nc.create_security_group_rule({"security_group_rule": http})["security_group_rule"]
assert (rule["protocol"], rule["remote_ip_prefix"], rule["ethertype"]) == (
    "tcp", "192.0.2.0/24", "IPv4"), rule
peer = nc.create_security_group_rule({"security_group_rule": {
    "security_group_id": sg["id"], "direction": "ingress", "protocol": "udp",
    "port_range_min": 53, "port_range_max": 53, "remote_group_id": default["id"]}})[
    "security_group_rule"]
assert peer["remote_group_id"] == default["id"], peer
refused(lambda: nc.create_security_group_rule({"security_group_rule": http}), nexc.Conflict,
        "Security group rule already exists. Rule id is %s." % rule["id"])
refused(lambda: nc.create_security_group_rule({"security_group_rule": dict(
    http, port_range_min=90)}), nexc.BadRequest, "port_range_min must be <= port_range_max")
refused(lambda: nc.show_security_group("00000000-0000-0000-0000-000000000000"),
        nexc.NotFound, "does not exist")
rules = nc.list_security_group_rules(security_group_id=sg["id"])["security_group_rules"]
assert len(rules) == 4, rules
assert len(nc.show_security_group(sg["id"])["security_group"]["security_group_rules"]) == 4
secured = nc.create_port({"port": {"network_id": net["id"], "security_groups": [sg["id"]]}})[
    "port"]
assert secured["security_groups"] == [sg["id"]], secured
plain = nc.create_port({"port": {"network_id": net["id"]}})["port"]
assert plain["security_groups"] == [default["id"]], plain
unsecured = nc.create_port({"port": {"network_id": net["id"], "port_security_enabled": False}})[
    "port"]
assert (unsecured["port_security_enabled"], unsecured["security_groups"]) == (False, [])
refused(lambda: nc.create_port({"port": {"network_id": net["id"], "port_security_enabled": False,
                                         "security_groups": [sg["id"]]}}),
        nexc.BadRequest, "Port security must be enabled")
refused(lambda: nc.delete_security_group(sg["id"]), nexc.Conflict, "in use")
unused = nc.list_security_groups(project_id="nc-other")["security_groups"]
assert [g["name"] for g in unused] == ["default"], unused
refused(lambda: nc.delete_security_group(unused[0]["id"]), nexc.Conflict,
        "Insufficient rights for removing default security group.")
nc.update_port(secured["id"], {"port": {"port_security_enabled": False, "security_groups": []}})
nc.delete_security_group_rule(rule["id"])
nc.delete_security_group(sg["id"])
assert [g["name"] for g in nc.list_security_groups(project_id="corvid")["security_groups"]] == [
    "default"]

for p in nc.list_ports(network_id=net["id"])["ports"]:
    nc.delete_port(p["id"])
nc.delete_subnet(sub["id"])
nc.delete_network(net["id"])
nc.delete_subnetpool(pool["id"])
assert nc.list_networks()["networks"] == []
print("neutronclient: ok")
