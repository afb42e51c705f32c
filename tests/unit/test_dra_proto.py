"""The kubelet's DRA and plugin registration APIs as the DRA plugin speaks them
(cudatrace/deploy/dra.proto, pluginregistration.proto; classes built at run time by
cudatrace/protodesc.py): the bytes on the wire are those of the upstream messages
(k8s.io/kubelet/pkg/apis/dra/v1/api.proto, pluginregistration/v1/api.proto), whose field
numbers are written out here by hand, apart from the .proto files; the descriptors are
protoc's own; the gRPC method paths are the ones the kubelet calls."""

from __future__ import annotations

import pytest

from cudatrace.deploy import dra_grpc


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def ld(number: int, payload: bytes | str) -> bytes:
    """A length-delimited field (wire type 2): strings, messages, map entries."""
    data = payload.encode() if isinstance(payload, str) else payload
    return varint(number << 3 | 2) + varint(len(data)) + data


def vi(number: int, value: int) -> bytes:
    """A varint field (wire type 0): bools, integers."""
    return varint(number << 3) + varint(value)


# upstream's field numbers, by message (the kubelet's api.proto files)
CLAIM = ld(1, "ns-a") + ld(2, "0f5c-uid") + ld(3, "claim-a")  # namespace, uid, name
DEVICE = ld(1, "gpu") + ld(1, "aux") + ld(2, "node-1") + ld(3, "gpu-0") + ld(4, "v.dev/k=x")
PREPARED = ld(1, DEVICE) + ld(2, "")  # devices, error (proto3: an empty string is not sent)
PREPARED_WIRE = ld(1, DEVICE)


@pytest.fixture(scope="module")
def api():
    return dra_grpc.protos()


def test_dra_messages_match_upstream_field_numbers(api):
    dra, _ = api
    M = dra.messages
    claim = M["Claim"](namespace="ns-a", uid="0f5c-uid", name="claim-a")
    assert claim.SerializeToString() == CLAIM
    assert M["NodePrepareResourcesRequest"](claims=[claim]).SerializeToString() == ld(1, CLAIM)
    assert M["NodeUnprepareResourcesRequest"].FromString(ld(1, CLAIM)).claims[0] == claim
    dev = M["Device"](request_names=["gpu", "aux"], pool_name="node-1", device_name="gpu-0",
                      cdi_device_ids=["v.dev/k=x"])  # fmt: skip
    assert dev.SerializeToString() == DEVICE
    one = M["NodePrepareResourceResponse"](devices=[dev])
    assert one.SerializeToString() == PREPARED_WIRE
    failed = M["NodePrepareResourceResponse"].FromString(ld(2, "no such claim"))
    assert failed.error == "no such claim" and not failed.devices
    # map<string, NodePrepareResourceResponse> claims = 1: entries of key = 1, value = 2
    resp = M["NodePrepareResourcesResponse"]()
    resp.claims["0f5c-uid"].CopyFrom(one)
    wire = ld(1, ld(1, "0f5c-uid") + ld(2, PREPARED_WIRE))
    assert resp.SerializeToString() == wire
    back = M["NodePrepareResourcesResponse"].FromString(wire)
    assert list(back.claims) == ["0f5c-uid"] and back.claims["0f5c-uid"].devices[0] == dev
    un = M["NodeUnprepareResourcesResponse"]()
    un.claims["u"].error = "busy"
    assert un.SerializeToString() == ld(1, ld(1, "u") + ld(2, ld(1, "busy")))
    # an entry whose value is empty still names its claim (every claim gets an answer)
    empty = M["NodeUnprepareResourcesResponse"]()
    empty.claims["u"].SetInParent()
    assert M["NodeUnprepareResourcesResponse"].FromString(
        empty.SerializeToString()
    ).claims.keys() == {"u"}


def test_registration_messages_match_upstream_field_numbers(api):
    _, reg = api
    M = reg.messages
    info = M["PluginInfo"](type="DRAPlugin", name="gpu.cudatrace.dev", endpoint="/p/dra.sock",
                           supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"])  # fmt: skip
    assert info.SerializeToString() == (
        ld(1, "DRAPlugin") + ld(2, "gpu.cudatrace.dev") + ld(3, "/p/dra.sock")
        + ld(4, "v1.DRAPlugin") + ld(4, "v1beta1.DRAPlugin")
    )  # fmt: skip
    status = M["RegistrationStatus"].FromString(vi(1, 1) + ld(2, "bad version"))
    assert status.plugin_registered is True and status.error == "bad version"
    assert M["InfoRequest"]().SerializeToString() == b""
    assert M["RegistrationStatusResponse"]().SerializeToString() == b""


def test_method_paths_are_the_kubelets(api):
    """The kubelet calls /<package>.<Service>/<Method>; the registration lists the services
    as "<version>.DRAPlugin"."""
    dra, reg = api
    assert dra.package == "k8s.io.kubelet.pkg.apis.dra.v1"
    assert set(dra.services) == {"k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"}
    assert set(dra.services["k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"]) == {
        "NodePrepareResources",
        "NodeUnprepareResources",
    }
    assert dra_grpc.SERVICES == {
        "v1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
        "v1beta1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
    }
    assert reg.package == "pluginregistration"  # upstream's, though the API is v1
    assert set(reg.services["pluginregistration.Registration"]) == {
        "GetInfo",
        "NotifyRegistrationStatus",
    }
    assert dra_grpc.PLUGIN_TYPE == "DRAPlugin"


@pytest.mark.parametrize("name", ["dra.proto", "pluginregistration.proto"])
def test_descriptors_are_protocs(tmp_path, name):
    """What protodesc builds from the shipped .proto is protoc's descriptor, byte for byte:
    map entries, method options and all."""
    from pathlib import Path

    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    import cudatrace.deploy
    from cudatrace.protodesc import parse

    here = Path(cudatrace.deploy.__file__).parent
    out = tmp_path / "set.pb"
    assert protoc.main(["protoc", f"-I{here}", f"--descriptor_set_out={out}", name]) == 0
    theirs = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    assert parse((here / name).read_text(), name) == theirs
