// A DOM for React in Node (jsdom). Imported before react-dom, which looks for `window` when it loads.
import { JSDOM } from "jsdom";

const dom = new JSDOM("<!doctype html><html><body></body></html>", { url: "https://shop.example/" });
globalThis.window = dom.window;
globalThis.document = dom.window.document;
if (typeof globalThis.navigator === "undefined") globalThis.navigator = dom.window.navigator;
for (const name of ["HTMLElement", "Node", "Event", "MouseEvent"]) globalThis[name] ??= dom.window[name];
// tells React that updates are wrapped in act(), so it flushes them before act returns
globalThis.IS_REACT_ACT_ENVIRONMENT = true;
