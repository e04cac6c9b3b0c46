"""ModelInferResponse as the gRPC front-end writes it (grpc_api/messages.py): its raw output contents
appended by hand to what protobuf serialized, which must be byte for byte what protobuf itself writes
(deterministically: a map's entries otherwise come in an order that differs from process to process)."""

from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from container.grpc_api import messages

names = st.text("abcxyz_", min_size=1, max_size=8)
# each output's binary data: its length across the varint's one, two and three bytes, and whether it arrives as
# a memoryview (as shared memory does), or None for an output written to the client's shared memory
outputs = st.lists(st.fixed_dictionaries(
    {"name": names, "datatype": st.sampled_from(["FP32", "INT64", "BYTES"]),
     "shape": st.lists(st.integers(0, 1 << 20), max_size=3),
     "data": st.one_of(st.none(), st.tuples(st.sampled_from([0, 1, 127, 128, 16383, 16384, 70000]), st.booleans()))},
    optional={"parameters": st.dictionaries(st.sampled_from(["classification", "note"]),
                                            st.one_of(st.integers(0, 1 << 40), st.text(max_size=4), st.booleans()))}),
    max_size=3)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(outputs=outputs, final=st.sampled_from([None, True, False]), answer_id=st.sampled_from([None, "", "r1"]))
def test_the_response_is_what_protobuf_writes(outputs, final, answer_id):
    data = [bytes([n % 251]) * o["data"][0] if o["data"] else b"" for n, o in enumerate(outputs)]
    sent = [memoryview(d) if o["data"][1] else d for d, o in zip(data, outputs, strict=True) if o["data"]]
    entries = [{**{k: v for k, v in o.items() if k != "data"},
                **({"parameters": {**o.get("parameters", {}), "binary_data_size": len(d)}} if o["data"] else {})}
               for d, o in zip(data, outputs, strict=True)]
    answer = {"model_name": "m", "model_version": "3", "outputs": entries, **({"id": answer_id} if answer_id is not None else {})}

    written = messages.infer_response(answer, sent, final)
    parsed = pb.ModelInferResponse.FromString(written)
    assert list(parsed.raw_output_contents) == data  # one an output, as Triton's: empty for one in shared memory
    assert parsed.model_name == "m" and parsed.model_version == "3" and parsed.id == (answer_id or "")
    assert [o.name for o in parsed.outputs] == [o["name"] for o in outputs]
    assert all("binary_data_size" not in o.parameters for o in parsed.outputs)
    assert ("triton_final_response" in parsed.parameters) == (final is not None)
    assert written == parsed.SerializeToString(deterministic=True)

    streamed = messages.infer_response(answer, sent, final, stream=True)
    assert pb.ModelStreamInferResponse.FromString(streamed).infer_response == parsed
    assert streamed == pb.ModelStreamInferResponse(infer_response=parsed).SerializeToString(deterministic=True)
