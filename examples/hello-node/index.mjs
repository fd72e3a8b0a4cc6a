// A Cortex Node app: each exported function is an endpoint, POST /{function},
// called with the JSON body as its one argument.
const _greeting = (name) => `Hello, ${name}!`;

export async function run({ name = "world" } = {}) {
  await new Promise((resolve) => setTimeout(resolve, 5));
  console.log(`greeting ${name}`);
  return { message: _greeting(name) };
}

export function reverse({ text }) {
  if (typeof text !== "string") throw new TypeError("text must be a string");
  return { text: [...text].reverse().join("") };
}

export { _greeting };
