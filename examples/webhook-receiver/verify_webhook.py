"""Verify a skiff webhook delivery with the Python standard library alone.

secret:  the X-Webhook-Secret you sent on the invoking call
headers: the delivery's HTTP headers (any capitalisation)
body:    the raw request body, exactly as received (bytes)
Returns the request id (the run id); raises ValueError when the delivery is
not authentic.
"""
import hashlib
import hmac
import time


def verify_webhook(secret, headers, body, tolerance_seconds=300, now=None):
    h = {k.lower(): v for k, v in headers.items()}
    request_id = h.get("x-request-id")
    timestamp = h.get("x-service-webhook-timestamp")
    signature = h.get("x-service-webhook-signature")
    if not (request_id and timestamp and signature):
        raise ValueError("missing signature headers")
    if not signature.startswith("v1,"):
        raise ValueError("bad signature format")
    if not timestamp.isdigit():
        raise ValueError("bad timestamp")
    now = time.time() if now is None else now
    if abs(now - int(timestamp)) > tolerance_seconds:
        raise ValueError("timestamp outside tolerance")
    signed = f"{request_id}.{timestamp}.".encode() + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature[len("v1,"):]):
        raise ValueError("signature mismatch")
    return request_id
