"""Two BLS calls in flight together from an async execute."""

import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, name) for name in ("A", "B")]
            calls = [pb_utils.InferenceRequest(model_name=model, requested_output_names=[wanted], inputs=inputs).async_exec()
                     for model, wanted in (("mix_torch", "SUM"), ("mix_ts", "PRODUCT"))]
            answers = await asyncio.gather(*calls)
            failed = next((answer for answer in answers if answer.has_error()), None)
            if failed is not None:
                raise pb_utils.TritonModelException(failed.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.get_output_tensor_by_name(answers[0], "SUM"),
                pb_utils.get_output_tensor_by_name(answers[1], "PRODUCT")]))
        return responses
