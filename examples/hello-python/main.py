"""A Cortex Python app: each public function is an endpoint, POST /{function}."""
import math


def _greeting(name):
    # Private: names starting with "_" are not endpoints.
    return f"Hello, {name}!"


def run(name="world"):
    print(f"greeting {name}")
    return {"message": _greeting(name)}


def stats(numbers):
    if not numbers:
        raise ValueError("numbers must not be empty")
    mean = sum(numbers) / len(numbers)
    return {"count": len(numbers), "mean": mean, "stdev": math.sqrt(sum((n - mean) ** 2 for n in numbers) / len(numbers))}
