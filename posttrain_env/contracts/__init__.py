"""What workflows and activities say to each other: pure pydantic models, and the activities'
interfaces (`contracts.activities`). Workflows import these, never the activities themselves;
activities implement them, never importing workflows (DESIGN §10)."""
