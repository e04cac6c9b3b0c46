"""Sum and product of two vectors, typed as the config declares its outputs."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.types = {name: pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, name)["data_type"])
                      for name in ("SUM", "PRODUCT")}
        pb_utils.Logger.log_info(f"mix {args['model_version']} ready on {args['model_instance_kind']}")

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", (a + b).astype(self.types["SUM"])),
                pb_utils.Tensor("PRODUCT", (a * b).astype(self.types["PRODUCT"])),
            ]))
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("mix unloaded")
