"""Which edit of a change did it: attribution of a trial's effects to its edits."""
