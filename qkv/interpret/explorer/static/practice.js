/*
 * practice.js: what a small character-level GPT did on the second article's practice sentence, so that
 * GPT's practice problems (figure 10) show real numbers in a page whose model is a translator (a GPT
 * run's page computes them live). Written by qkv/interpret/explorer/embedded.py (its docstring has the
 * commands); strict JSON below.
 */
globalThis.QKVPracticeExample = {"text":"今天天气很好","tokens":["今","天","天","气","很","好"],"problems":[{"prefix":["今"],"answer":"天","p":0.656236,"nll":0.421234,"top":[["天",0.656236],["晚",0.254188],["年",0.02406]],"unknown":false},{"prefix":["今","天"],"answer":"天","p":0.012047,"nll":4.418903,"top":[["早",0.214214],["下",0.084836],["晚",0.070006]],"unknown":false},{"prefix":["今","天","天"],"answer":"气","p":0.058805,"nll":2.83352,"top":[["早",0.138445],["下",0.07443],["气",0.058805]],"unknown":false},{"prefix":["今","天","天","气"],"answer":"很","p":0.034171,"nll":3.376384,"top":[["好",0.15829],["怎",0.105072],["预",0.041628]],"unknown":false},{"prefix":["今","天","天","气","很"],"answer":"好","p":0.159577,"nll":1.835229,"top":[["冷",0.202752],["热",0.198172],["好",0.159577]],"unknown":false}],"mean_nll":2.577054,"model":{"arch":"gpt","d_model":128,"n_heads":4,"d_k":32,"d_ff":512,"n_layers":4,"n_decoder_layers":4}};
