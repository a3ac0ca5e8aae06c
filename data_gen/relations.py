"""Relation P-ids, their labels, and the ambiguous-query filter of the paper's Appendix B (Table 4).

Labels come from DocRED's `rel_info.json` (default) or the original MemLLM code's variants
(`rel_labels_memllm.json`, e.g. P112 "founder", P150 "contains administrative territorial entities").
The ambiguous-query filter is keyed by P-id, so it works with either label set: the original code matched
Table 4's singular "contains administrative territorial entity" against its plural label, and that rule
never fired.
"""

from __future__ import annotations

# Table 4, subject queries <*, t, e_o> (the target is the subject): answering them lists many subjects.
AMBIGUOUS_SUBJECT_QUERY_PIDS: frozenset[str] = frozenset({
    "P27",    # country of citizenship
    "P17",    # country
    "P495",   # country of origin
    "P140",   # religion
    "P19",    # place of birth
    "P20",    # place of death
    "P937",   # work location
    "P276",   # location
    "P205",   # basin country
    "P551",   # residence
    "P740",   # location of formation
    "P577",   # publication date
    "P272",   # production company
    "P400",   # platform
    "P364",   # original language of work
    "P1001",  # applies to jurisdiction
    "P131",   # located in the administrative territorial entity
    "P159",   # headquarters location
    "P571",   # inception
    "P108",   # employer
    "P569",   # date of birth
    "P570",   # date of death
    "P69",    # educated at
})
# Table 4, object queries <e_s, t, *> (the target is the object).
AMBIGUOUS_OBJECT_QUERY_PIDS: frozenset[str] = frozenset({"P150"})  # contains administrative territorial entity


def is_ambiguous(pid: str, target_is_subject: bool) -> bool:
    """Appendix B: drop the query for this relation when it asks for the subject (or, for P150, the object)."""
    return pid in (AMBIGUOUS_SUBJECT_QUERY_PIDS if target_is_subject else AMBIGUOUS_OBJECT_QUERY_PIDS)
