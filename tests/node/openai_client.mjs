// The official `openai` client against strata serve. Usage:
//   node openai_client.mjs URL EXPECT_JSON
// EXPECT_JSON: {"completion": "...", "chat": "..."}: the greedy texts `strata generate --temp 0`
// gives for "Once upon a time" (24 tokens) and for the chat prompt rendered with the plain
// template (16 tokens). Prints ok / not ok lines; exits 1 on any failure.
import OpenAI from 'openai';

const [url, expectJson] = process.argv.slice(2);
const expect = JSON.parse(expectJson);
const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'sk-unused', maxRetries: 0 });
let failed = false;
const check = (name, cond, why) => {
  console.log(cond ? `ok - openai: ${name}` : `not ok - openai: ${name}: ${why}`);
  if (!cond) failed = true;
};

async function main() {
  const models = await client.models.list();
  check('models.list', models.data.length === 1 && models.data[0].object === 'model', JSON.stringify(models.data));

  const c = await client.completions.create({ model: models.data[0].id, prompt: 'Once upon a time', max_tokens: 24, temperature: 0 });
  check('completions.create', c.choices[0].text === expect.completion && c.usage.completion_tokens > 0 &&
        ['stop', 'length'].includes(c.choices[0].finish_reason), JSON.stringify(c));

  let text = '', finish = null, usage = null;
  const s = await client.completions.create({ model: 'm', prompt: 'Once upon a time', max_tokens: 24, temperature: 0,
                                              stream: true, stream_options: { include_usage: true } });
  for await (const chunk of s) {
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) { text += ch.text; finish = ch.finish_reason || finish; }
  }
  check('completions.create stream', text === expect.completion && finish && usage && usage.total_tokens > 0,
        JSON.stringify({ text, finish, usage }));

  const messages = [{ role: 'user', content: 'Once upon a time' }];
  const chat = await client.chat.completions.create({ model: 'm', messages, max_tokens: 16, temperature: 0 });
  check('chat.completions.create', chat.object === 'chat.completion' && chat.choices[0].message.role === 'assistant' &&
        chat.choices[0].message.content === expect.chat, JSON.stringify(chat));

  text = ''; let role = null;
  const cs = await client.chat.completions.create({ model: 'm', messages, max_tokens: 16, temperature: 0, stream: true });
  for await (const chunk of cs) {
    for (const ch of chunk.choices) { role = ch.delta.role || role; text += ch.delta.content || ''; }
  }
  check('chat.completions.create stream', role === 'assistant' && text === expect.chat, JSON.stringify({ role, text }));

  // a chat's second turn sends the first again: the server's prefix cache serves that part, and
  // the client reads how much in usage.prompt_tokens_details.cached_tokens
  const sys = { role: 'system', content: 'You tell short happy stories about a little girl named Lily and her dog in the park.' };
  const t1 = await client.chat.completions.create({ model: 'm', messages: [sys, messages[0]], max_tokens: 8, temperature: 0 });
  const t2 = await client.chat.completions.create({
    model: 'm', max_tokens: 8, temperature: 0,
    messages: [sys, messages[0], { role: 'assistant', content: t1.choices[0].message.content }, { role: 'user', content: 'And then?' }],
  });
  const d = t2.usage.prompt_tokens_details;
  check('usage.prompt_tokens_details.cached_tokens: the second turn of a chat reuses the first',
        d && d.cached_tokens >= 16 && d.cached_tokens < t2.usage.prompt_tokens, JSON.stringify([t1.usage, t2.usage]));

  try {
    await client.completions.create({ model: 'm', prompt: 'x', max_tokens: -1 });
    check('errors surface as APIError', false, 'no error');
  } catch (e) {
    check('errors surface as APIError with the server message', e instanceof OpenAI.APIError && e.status === 400 &&
          /max_tokens/.test(e.message), String(e));
  }
}

main().then(() => process.exit(failed ? 1 : 0), (e) => { console.log(`not ok - openai: ${e}`); process.exit(1); });
