"""The OpenAI-compatible HTTP server: `python -m project04_llm_inference serve`.

api.py (aiohttp routes, errors, start and graceful stop), protocol.py (request bodies checked
field by field), responses.py (JSON answers and server-sent events), chat.py (chat template),
async_engine.py (the engine loop apart from HTTP), metrics.py (Prometheus).
"""
