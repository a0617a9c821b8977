"""The shared vocabulary: errors, filesystem helpers, progress bars. Imports nothing of headrace."""
