// Preloaded with `node --import <this file>` into a server that has no host option: a
// listen() without a host binds 127.0.0.1 instead of every interface.
import net from "node:net";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const first = args[0];
  const isPort = typeof first === "number" || (typeof first === "string" && /^\d+$/.test(first));
  if (isPort && typeof args[1] !== "string") {
    args.splice(1, 0, "127.0.0.1");
  } else if (first && typeof first === "object" && first.path === undefined && !first.host) {
    args[0] = { ...first, host: "127.0.0.1" };
  }
  return listen.apply(this, args);
};
