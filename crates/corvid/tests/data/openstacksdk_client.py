"""Drives a corvid controller with openstacksdk, the client kuryr-kubernetes and most
current OpenStack tools use: keystoneauth discovers the network API at `/` and the
load-balancer API at `/v2` before any call. Exits non-zero on the first surprise."""
import sys
import warnings

warnings.simplefilter("ignore")
import openstack  # noqa: E402

url = sys.argv[1]
conn = openstack.connection.Connection(
    auth_type="none",
    auth={"endpoint": url},
    network_endpoint_override=url,
    load_balancer_endpoint_override=url + "/v2",
    region_name="RegionOne",
)
net = conn.network.create_network(name="sdk-net")
sub = conn.network.create_subnet(network_id=net.id, cidr="10.61.0.0/24", ip_version=4)
assert sub.gateway_ip == "10.61.0.1", sub
port = conn.network.create_port(network_id=net.id, device_id="c9", name="p9")
ip = port.fixed_ips[0]["ip_address"]
assert port.status == "DOWN" and port.mac_address.startswith("fa:16:3e:"), port
assert [p.id for p in conn.network.ports(device_id="c9")] == [port.id]
conn.network.set_tags(port, ["a", "b"])
assert sorted(conn.network.get_port(port.id).tags) == ["a", "b"]
assert "subnet_allocation" in {e.alias for e in conn.network.extensions()}

lb = conn.load_balancer.create_load_balancer(name="lb1", vip_subnet_id=sub.id)
assert lb.vip_address and lb.vip_address != ip, lb
listener = conn.load_balancer.create_listener(
    loadbalancer_id=lb.id, protocol="TCP", protocol_port=80
)
pool = conn.load_balancer.create_pool(
    listener_id=listener.id, protocol="TCP", lb_algorithm="ROUND_ROBIN"
)
member = conn.load_balancer.create_member(pool, address=ip, protocol_port=8080)
assert [m.address for m in conn.load_balancer.members(pool)] == [ip]
conn.load_balancer.delete_member(member, pool)
conn.load_balancer.delete_pool(pool)
conn.load_balancer.delete_listener(listener)
conn.load_balancer.delete_load_balancer(lb)
assert list(conn.load_balancer.load_balancers()) == []

public = conn.network.create_network(name="public", is_router_external=True)
conn.network.create_subnet(network_id=public.id, cidr="198.51.100.0/24", ip_version=4)
router = conn.network.create_router(name="r1", external_gateway_info={"network_id": public.id})
assert router.external_gateway_info["network_id"] == public.id, router
conn.network.add_interface_to_router(router, subnet_id=sub.id)
owners = {p.device_owner for p in conn.network.ports(device_id=router.id)}
assert owners == {"network:router_interface", "network:router_gateway"}, owners
route = {"destination": "192.0.2.0/24", "nexthop": "10.61.0.9"}
conn.network.add_extra_routes_to_router(router, body={"router": {"routes": [route]}})
assert conn.network.get_router(router.id).routes == [route]
conn.network.update_router(router, routes=[])
conn.network.remove_interface_from_router(router, subnet_id=sub.id)
conn.network.update_router(router, external_gateway_info={})
conn.network.delete_router(router)
assert list(conn.network.routers()) == []
for s in conn.network.subnets(network_id=public.id):
    conn.network.delete_subnet(s)
conn.network.delete_network(public)

# Security groups: the default group, one of its own with rules, ports with and without.
import openstack.exceptions as sdk_exc  # noqa: E402

default = [g for g in conn.network.security_groups() if g.name == "default"]
assert len(default) == 1 and len(default[0].security_group_rules) == 4, default
default = default[0]
assert port.security_group_ids == [default.id], port
sg = conn.network.create_security_group(name="sdk-web", description="web")
assert sg.stateful and len(sg.security_group_rules) == 2, sg
conn.network.update_security_group(sg, description="front")
assert conn.network.get_security_group(sg.id).description == "front"
http = dict(security_group_id=sg.id, direction="ingress", protocol="tcp", port_range_min=80,
            port_range_max=80, remote_ip_prefix="10.0.0.0/8", ether_type="IPv4")
rule = conn.network.create_security_group_rule(**http)
assert (rule.protocol, rule.remote_ip_prefix, rule.port_range_min) == ("tcp", "10.0.0.0/8", 80)
peer = conn.network.create_security_group_rule(
    security_group_id=sg.id, direction="ingress", ether_type="IPv6", remote_group_id=default.id)
assert peer.remote_group_id == default.id, peer
try:
    conn.network.create_security_group_rule(**http)
    raise AssertionError("a rule was made twice")
except sdk_exc.ConflictException as e:
    assert "already exists" in str(e), e
assert len(list(conn.network.security_group_rules(security_group_id=sg.id))) == 4
secured = conn.network.create_port(network_id=net.id, security_group_ids=[sg.id])
assert secured.security_group_ids == [sg.id], secured
unsecured = conn.network.create_port(network_id=net.id, is_port_security_enabled=False)
assert (unsecured.is_port_security_enabled, unsecured.security_group_ids) == (False, [])
try:
    conn.network.delete_security_group(sg)
    raise AssertionError("a group a port has was deleted")
except sdk_exc.ConflictException as e:
    assert "in use" in str(e), e
conn.network.update_port(secured, security_group_ids=[default.id])
conn.network.delete_security_group_rule(rule)
conn.network.delete_security_group(sg)
assert [g.name for g in conn.network.security_groups()] == ["default"]
for p in (secured, unsecured):
    conn.network.delete_port(p)

conn.network.delete_port(port)
conn.network.delete_subnet(sub)
conn.network.delete_network(net)
assert list(conn.network.networks()) == []
print("openstacksdk: ok")
