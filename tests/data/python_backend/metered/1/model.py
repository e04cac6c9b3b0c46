"""Custom metrics: a counter and a gauge, labelled, read on the server's metrics port."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        # the families are kept as long as their metrics: Triton ends a family's metrics with it
        self.families = [pb_utils.MetricFamily(name="metered_rows", description="Rows this model has doubled",
                                               kind=pb_utils.MetricFamily.COUNTER),
                         pb_utils.MetricFamily(name="metered_last_batch_rows", description="Rows in the last batch",
                                               kind=pb_utils.MetricFamily.GAUGE)]
        self.rows, self.last = (family.Metric(labels=labels) for family in self.families)

    def execute(self, requests):
        responses, rows = [], 0
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            rows += len(x)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
        self.rows.increment(rows)
        self.last.set(rows)
        if self.rows.value() < rows:
            raise pb_utils.TritonModelException("the counter went backwards")
        return responses
