"""Protocol front-ends: bytes ↔ InferRequest/InferResponse, core errors ↔ statuses. No torch here."""
