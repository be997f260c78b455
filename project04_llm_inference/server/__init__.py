"""The OpenAI-compatible HTTP server: `python -m project04_llm_inference serve`.

api.py (aiohttp routes, errors, start and graceful stop), guard.py (Host, Origin and
Content-Type checks), json_body.py (the body's JSON, bounded), protocol.py (request bodies
checked field by field), responses.py (JSON answers and server-sent events), chat.py (chat
template), async_engine.py (the engine loop apart from HTTP), metrics.py (Prometheus).
"""
