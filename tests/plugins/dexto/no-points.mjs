// Invalid: none of the four extension points.
export default class NoPoints {
  async beforeEverything() {
    return { ok: true };
  }
}
