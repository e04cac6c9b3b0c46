"""V2's tensors and documents, whatever the transport and whatever the process: the codec of V2 bodies
(codec.py), V2 documents as the core's requests and its responses as documents (documents.py), and the
view of a model that lets a front-end do that work itself (views.py). The HTTP routes (api/), the HTTP
front-ends (http_frontend/) and the gRPC front-ends (grpc_api/) all decode here; nothing here knows a
transport, the core or an event loop."""
