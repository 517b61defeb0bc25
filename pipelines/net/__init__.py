"""Talking to remote services: retry policies, request-rate limiters and whole-request deadlines,
shared by acquisition, E-utilities and the OpenAI-compatible VLM backend."""
