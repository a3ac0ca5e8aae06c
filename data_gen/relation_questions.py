"""Natural questions that ask for the object of a (subject, relation) pair, keyed by relation P-id.

Written for this project from the meaning of each Wikidata property in DocRED's 96 relations (the subject is
the triple's head, the answer its tail): "Where was {subject} born?" for P19 rather than the label's literal
"What is the place of birth of {subject}?". The question-form memory-write and memory-read examples draw from
them, so that a model learns which relation a question asks about from how people phrase it, not only from
questions that spell the label out. Keyed by P-id so that either label set (`memllm_jax.docred.load_relation_labels`)
uses them; a relation without an entry falls back to `GENERIC_TEMPLATES`.
"""

from __future__ import annotations

import random

GENERIC_TEMPLATES: tuple[str, ...] = ("What is the {relation} of {subject}?",
                                      "What {relation} is associated with {subject}?")
"""Questions that spell the relation label out: the only form for a relation without natural questions."""

QUESTIONS_BY_PID: dict[str, tuple[str, ...]] = {
    "P6": ("Who is the head of government of {subject}?", "Who leads the government of {subject}?"),
    "P17": ("Which country is {subject} in?", "In which country is {subject}?", "What country does {subject} belong to?"),
    "P19": ("Where was {subject} born?", "In which city was {subject} born?", "What is the birthplace of {subject}?"),
    "P20": ("Where did {subject} die?", "In which place did {subject} die?"),
    "P22": ("Who is the father of {subject}?", "Who was {subject}'s father?"),
    "P25": ("Who is the mother of {subject}?", "Who was {subject}'s mother?"),
    "P26": ("Who is {subject} married to?", "Who was the spouse of {subject}?", "Whom did {subject} marry?"),
    "P27": ("What is the nationality of {subject}?", "Which country is {subject} a citizen of?"),
    "P30": ("Which continent is {subject} on?", "On what continent is {subject} located?"),
    "P31": ("What kind of thing is {subject}?", "What is {subject} an instance of?"),
    "P35": ("Who is the head of state of {subject}?", "Who was the head of state in {subject}?"),
    "P36": ("What is the capital of {subject}?", "Which city is the capital of {subject}?"),
    "P37": ("What is the official language of {subject}?", "Which language is official in {subject}?"),
    "P39": ("What position did {subject} hold?", "Which office did {subject} hold?"),
    "P40": ("Who is a child of {subject}?", "Who was {subject}'s son or daughter?"),
    "P50": ("Who wrote {subject}?", "Who is the author of {subject}?"),
    "P54": ("Which team did {subject} play for?", "What sports team was {subject} a member of?"),
    "P57": ("Who directed {subject}?", "Who was the director of {subject}?"),
    "P58": ("Who wrote the screenplay of {subject}?", "Who was the screenwriter of {subject}?"),
    "P69": ("Where was {subject} educated?", "Which school did {subject} attend?", "Where did {subject} study?"),
    "P86": ("Who composed the music of {subject}?", "Who was the composer of {subject}?"),
    "P102": ("Which political party was {subject} a member of?", "What party did {subject} belong to?"),
    "P108": ("Who was {subject}'s employer?", "Which organization did {subject} work for?"),
    "P112": ("Who founded {subject}?", "By whom was {subject} founded?"),
    "P118": ("Which league does {subject} play in?", "What league is {subject} part of?"),
    "P123": ("Who published {subject}?", "Which company was the publisher of {subject}?"),
    "P127": ("Who owns {subject}?", "By whom is {subject} owned?"),
    "P131": ("Where is {subject} located?", "In which administrative region is {subject}?"),
    "P136": ("What genre is {subject}?", "Which genre does {subject} belong to?"),
    "P137": ("Who operates {subject}?", "Which organization is the operator of {subject}?"),
    "P140": ("What religion does {subject} follow?", "What is the religion of {subject}?"),
    "P150": ("What administrative region does {subject} contain?", "Which place lies within {subject}?"),
    "P155": ("What came before {subject}?", "What does {subject} follow?"),
    "P156": ("What came after {subject}?", "What is {subject} followed by?"),
    "P159": ("Where is {subject} headquartered?", "In which city is the headquarters of {subject}?"),
    "P161": ("Who starred in {subject}?", "Who is a cast member of {subject}?"),
    "P162": ("Who produced {subject}?", "Who was the producer of {subject}?"),
    "P166": ("What award did {subject} receive?", "Which prize was {subject} awarded?"),
    "P170": ("Who created {subject}?", "Who is the creator of {subject}?"),
    "P171": ("What is the parent taxon of {subject}?", "Which genus or family does {subject} belong to?"),
    "P172": ("What ethnic group does {subject} belong to?", "What is the ethnicity of {subject}?"),
    "P175": ("Who performed {subject}?", "Which artist performed {subject}?"),
    "P176": ("Who manufactured {subject}?", "Which company makes {subject}?"),
    "P178": ("Who developed {subject}?", "Which company was the developer of {subject}?"),
    "P179": ("Which series is {subject} part of?", "What series does {subject} belong to?"),
    "P190": ("What is a sister city of {subject}?", "Which city is twinned with {subject}?"),
    "P194": ("What is the legislative body of {subject}?", "Which legislature governs {subject}?"),
    "P205": ("Which country is the basin of {subject} in?", "Through which country does {subject} drain?"),
    "P206": ("Which body of water is {subject} on?", "What body of water is {subject} next to?"),
    "P241": ("Which military branch did {subject} serve in?", "In which branch of the military was {subject}?"),
    "P264": ("What record label is {subject} signed to?", "Which label released {subject}?"),
    "P272": ("Which company produced {subject}?", "What is the production company of {subject}?"),
    "P276": ("Where is {subject}?", "What is the location of {subject}?"),
    "P279": ("What is {subject} a subclass of?", "What broader class does {subject} belong to?"),
    "P355": ("What is a subsidiary of {subject}?", "Which company does {subject} own as a subsidiary?"),
    "P361": ("What is {subject} part of?", "Of what is {subject} a part?"),
    "P364": ("What is the original language of {subject}?", "In which language was {subject} made?"),
    "P400": ("On which platform was {subject} released?", "What platform does {subject} run on?"),
    "P403": ("Into what does {subject} flow?", "Where is the mouth of {subject}?"),
    "P449": ("Which network first aired {subject}?", "On what network did {subject} originally air?"),
    "P463": ("What organization is {subject} a member of?", "Which group did {subject} belong to?"),
    "P488": ("Who chairs {subject}?", "Who is the chairperson of {subject}?"),
    "P495": ("Which country does {subject} come from?", "What is the country of origin of {subject}?"),
    "P527": ("What is a part of {subject}?", "What does {subject} consist of?"),
    "P551": ("Where did {subject} live?", "Where does {subject} reside?"),
    "P569": ("When was {subject} born?", "What is the date of birth of {subject}?"),
    "P570": ("When did {subject} die?", "What is the date of death of {subject}?"),
    "P571": ("When was {subject} founded?", "When was {subject} established?"),
    "P576": ("When was {subject} dissolved?", "When did {subject} cease to exist?"),
    "P577": ("When was {subject} published?", "When was {subject} released?"),
    "P580": ("When did {subject} start?", "What is the start time of {subject}?"),
    "P582": ("When did {subject} end?", "What is the end time of {subject}?"),
    "P585": ("When did {subject} take place?", "At what point in time did {subject} happen?"),
    "P607": ("In which war did {subject} fight?", "What conflict did {subject} take part in?"),
    "P674": ("Which character appears in {subject}?", "Who is a character in {subject}?"),
    "P676": ("Who wrote the lyrics of {subject}?", "Who was the lyricist of {subject}?"),
    "P706": ("On what terrain feature is {subject} located?", "Which mountain range or island is {subject} on?"),
    "P710": ("Who took part in {subject}?", "Who was a participant in {subject}?"),
    "P737": ("Who influenced {subject}?", "By whom was {subject} influenced?"),
    "P740": ("Where was {subject} formed?", "In which city was {subject} founded?"),
    "P749": ("What is the parent organization of {subject}?", "Which organization does {subject} belong to?"),
    "P800": ("What is a notable work of {subject}?", "What is {subject} known for?"),
    "P807": ("What did {subject} separate from?", "From which organization did {subject} split?"),
    "P840": ("Where is {subject} set?", "In what place does the story of {subject} take place?"),
    "P937": ("Where did {subject} work?", "In which city did {subject} work?"),
    "P1001": ("Which jurisdiction does {subject} apply to?", "Where does {subject} have legal force?"),
    "P1056": ("What does {subject} produce?", "What product is made by {subject}?"),
    "P1198": ("What is the unemployment rate of {subject}?", "How high is unemployment in {subject}?"),
    "P1336": ("Who claims the territory of {subject}?", "Which country claims {subject}?"),
    "P1344": ("Which event did {subject} take part in?", "In what event did {subject} participate?"),
    "P1365": ("What did {subject} replace?", "Whom did {subject} succeed?"),
    "P1366": ("What replaced {subject}?", "Who succeeded {subject}?"),
    "P1376": ("What is {subject} the capital of?", "Of which region is {subject} the capital?"),
    "P1412": ("What language does {subject} speak?", "Which languages did {subject} speak or write?"),
    "P1441": ("In which work does {subject} appear?", "Which story features {subject}?"),
    "P3373": ("Who is a sibling of {subject}?", "Who is {subject}'s brother or sister?"),
}


def ask(subject: str, relation: str, pid: str, rng: random.Random, natural: bool = True) -> str:
    """A question about `subject` whose answer is the object of `relation` (P-id `pid`): one of the relation's
    natural questions or one of the generic ones, drawn by `rng`; only generic ones when `natural` is False or
    the relation has no natural questions."""
    templates = GENERIC_TEMPLATES + (QUESTIONS_BY_PID.get(pid, ()) if natural else ())
    return rng.choice(templates).format(relation=relation, subject=subject)
