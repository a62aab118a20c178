"""qkv's models to and from other libraries: GPT-2 from and to Hugging Face (``gpt2``), a translator as HF's
MarianMTModel (``marian``), either model as a CTranslate2 spec (``ctranslate2``), and ``qkv export`` writing a
run as such a folder (``export``). Each library is optional (``errors.require``)."""
