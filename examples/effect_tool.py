"""README.md, "Tools with external side effects": an effect tool whose service keeps one
invoice per idempotency key (here an in-memory stand-in for a billing API), driven by a
scripted model (examples/invoice.json). Run: python examples/effect_tool.py"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tether import Agent, EffectTool, LookupResult, ToolResult, load_model


@dataclass
class Invoice:
    customer: str
    receipt: str


class Billing:
    """The service: sending twice with one idempotency key sends one invoice."""

    def __init__(self) -> None:
        self.invoices: dict[str, Invoice] = {}

    def send(self, customer: str, idempotency_key: str) -> str:
        found = self.invoices.setdefault(
            idempotency_key, Invoice(customer, f"inv-{len(self.invoices) + 1}")
        )
        return found.receipt

    def find(self, idempotency_key: str) -> Invoice | None:
        return self.invoices.get(idempotency_key)


billing = Billing()


class SendInvoice(EffectTool):
    name = "send_invoice"
    description = "Send an invoice to a customer."
    parameters = {"type": "object", "properties": {"customer": {"type": "string"}},
                  "required": ["customer"]}

    def execute(self, arguments, operation_id):
        receipt = billing.send(arguments["customer"], idempotency_key=operation_id)
        return ToolResult(f"sent ({receipt})")

    def lookup(self, operation_id):
        found = billing.find(idempotency_key=operation_id)
        if found is None:
            return LookupResult.not_found()
        return LookupResult.committed(ToolResult(f"sent ({found.receipt})"))


script = Path(__file__).resolve().parent / "invoice.json"
with Agent(load_model(f"scripted:{script}"), [SendInvoice()], workspace=".") as agent:
    result = agent.run("invoice ACME")
print(result.status, result.text)  # completed Invoice sent.
print(len(billing.invoices))  # 1
