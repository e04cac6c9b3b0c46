"""A decoupled model: each request's responses are sent from a thread of its own, after execute returns."""

import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        if not pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"])):
            raise pb_utils.TritonModelException("countdown answers as a decoupled model only")
        self.threads = []

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            thread = threading.Thread(target=self.count, args=(request.get_response_sender(), n))
            thread.start()
            self.threads.append(thread)
        return None

    def count(self, sender, n):
        if n < 0:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"cannot count down from {n}")))
        for left in range(n - 1, -1, -1):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("LEFT", np.array([left], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
