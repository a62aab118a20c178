"""Shared text for the tokenizer tests: English, German, Chinese (with its punctuation), mixed."""

import pytest

TEXTS = [
    "A man in an orange hat starring at something.",
    "Two young, White males are outside near many bushes.",
    "Ein Mädchen läuft über die Straße, während ein Hund bellt!",
    "Große Männer öffnen die Tür für Ärzte und Übersetzer.",
    "小明累了，他想睡觉。",
    "你好！你吃饭了吗？我很好。",
    "他说：“我们明天在学校见。”",
    "Mixed 中文 and English, mit Umlauten: ä ö ü ß, 2024年。",
    "  leading and trailing spaces  ",
    "Tabs\tand  double  spaces, CAPS and lower.",
]


@pytest.fixture(scope="session")
def texts():
    return tuple(TEXTS)
