"""ModelInferResponse as the gRPC front-end writes it (grpc_api/messages.py): its raw output contents
appended by hand to what protobuf serialized, which must be byte for byte what protobuf itself writes
(deterministically: a map's entries otherwise come in an order that differs from process to process)."""

from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from container.grpc_api import messages

names = st.text("abcxyz_", min_size=1, max_size=8)
outputs = st.lists(st.fixed_dictionaries(
    {"name": names, "datatype": st.sampled_from(["FP32", "INT64", "BYTES"]),
     "shape": st.lists(st.integers(0, 1 << 20), max_size=3)},
    optional={"parameters": st.dictionaries(st.sampled_from(["binary_data_size", "classification", "note"]),
                                            st.one_of(st.integers(0, 1 << 40), st.text(max_size=4), st.booleans()))}),
    max_size=3)
# lengths across the varint's one, two and three bytes; some as memoryviews, as shared memory arrives
chunks = st.lists(st.tuples(st.sampled_from([0, 1, 127, 128, 16383, 16384, 70000]), st.booleans()), max_size=3)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(outputs=outputs, chunks=chunks, final=st.sampled_from([None, True, False]), answer_id=st.sampled_from([None, "", "r1"]))
def test_the_response_is_what_protobuf_writes(outputs, chunks, final, answer_id):
    answer = {"model_name": "m", "model_version": "3", "outputs": outputs, **({"id": answer_id} if answer_id is not None else {})}
    data = [bytes([n % 251]) * size for n, (size, _) in enumerate(chunks)]
    sent = [memoryview(d) if view else d for d, (_, view) in zip(data, chunks, strict=True)]

    written = messages.infer_response(answer, sent, final)
    parsed = pb.ModelInferResponse.FromString(written)
    assert list(parsed.raw_output_contents) == data
    assert parsed.model_name == "m" and parsed.model_version == "3" and parsed.id == (answer_id or "")
    assert [o.name for o in parsed.outputs] == [o["name"] for o in outputs]
    assert ("triton_final_response" in parsed.parameters) == (final is not None)
    assert written == parsed.SerializeToString(deterministic=True)

    streamed = messages.infer_response(answer, sent, final, stream=True)
    assert pb.ModelStreamInferResponse.FromString(streamed).infer_response == parsed
    assert streamed == pb.ModelStreamInferResponse(infer_response=parsed).SerializeToString(deterministic=True)
