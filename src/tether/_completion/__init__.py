"""Honest completion: artifact versions, verification evidence, the completion gate,
stop conditions and authorization of effects before they run."""
