/* FSRS-6, the spaced-repetition scheduler Anki uses by default, for the practice page.
 *
 * A line-by-line port of the reference implementation, py-fsrs 6.3 (`fsrs.scheduler.Scheduler`,
 * https://github.com/open-spaced-repetition/py-fsrs), with its defaults: the 21 default
 * parameters, desired retention 0.9, learning steps 1 min and 10 min, one relearning step of
 * 10 min, a maximum interval of 36500 days, and fuzzing off (so that a schedule can be
 * checked; tests/test_practice.py replays the same review histories through py-fsrs and this
 * file in Chromium and compares stability, difficulty and due dates).
 *
 * Times are milliseconds since the epoch (UTC). A card is
 *   {state: 1 learning | 2 review | 3 relearning, step, stability, difficulty, due, last_review}
 * with null stability, difficulty and last_review before its first review.
 * Ratings: 1 Again, 2 Hard, 3 Good, 4 Easy.
 */
(function () {
  "use strict";

  const DEFAULT_PARAMETERS = [
    0.212, 1.2931, 2.3065, 8.2956, 6.4133, 0.8334, 3.0194, 0.001, 1.8722, 0.1666, 0.796,
    1.4835, 0.0614, 0.2629, 1.6483, 0.6014, 1.8729, 0.5425, 0.0912, 0.0658, 0.1542,
  ];
  const STABILITY_MIN = 0.001;
  const MIN_DIFFICULTY = 1.0;
  const MAX_DIFFICULTY = 10.0;
  const MINUTE = 60 * 1000;
  const DAY = 24 * 60 * MINUTE;
  const LEARNING = 1, REVIEW = 2, RELEARNING = 3;
  const AGAIN = 1, HARD = 2, GOOD = 3, EASY = 4;

  // Python's round(): halves go to the even neighbour.
  function pyRound(x) {
    const floor = Math.floor(x);
    const diff = x - floor;
    if (diff > 0.5) return floor + 1;
    if (diff < 0.5) return floor;
    return floor % 2 === 0 ? floor : floor + 1;
  }

  // timedelta.days: whole days, rounded down.
  function wholeDays(ms) {
    return Math.floor(ms / DAY);
  }

  function Scheduler(options) {
    const o = options || {};
    this.w = (o.parameters || DEFAULT_PARAMETERS).slice();
    this.desiredRetention = o.desiredRetention === undefined ? 0.9 : o.desiredRetention;
    this.learningSteps = o.learningSteps || [1 * MINUTE, 10 * MINUTE];
    this.relearningSteps = o.relearningSteps || [10 * MINUTE];
    this.maximumInterval = o.maximumInterval || 36500;
    this.DECAY = -this.w[20];
    this.FACTOR = Math.pow(0.9, 1 / this.DECAY) - 1;
  }

  Scheduler.prototype.newCard = function (now) {
    return { state: LEARNING, step: 0, stability: null, difficulty: null, due: now, last_review: null };
  };

  Scheduler.prototype.clampDifficulty = function (d) {
    return Math.min(Math.max(d, MIN_DIFFICULTY), MAX_DIFFICULTY);
  };

  Scheduler.prototype.clampStability = function (s) {
    return Math.max(s, STABILITY_MIN);
  };

  Scheduler.prototype.retrievability = function (card, now) {
    if (card.last_review === null || card.stability === null) return 0;
    const elapsed = Math.max(0, wholeDays(now - card.last_review));
    return Math.pow(1 + this.FACTOR * elapsed / card.stability, this.DECAY);
  };

  Scheduler.prototype.initialStability = function (rating) {
    return this.clampStability(this.w[rating - 1]);
  };

  Scheduler.prototype.initialDifficulty = function (rating, clamp) {
    const d = this.w[4] - Math.pow(Math.E, this.w[5] * (rating - 1)) + 1;
    return clamp ? this.clampDifficulty(d) : d;
  };

  Scheduler.prototype.nextInterval = function (stability) {
    let days = (stability / this.FACTOR) * (Math.pow(this.desiredRetention, 1 / this.DECAY) - 1);
    days = pyRound(days);
    days = Math.max(days, 1);
    return Math.min(days, this.maximumInterval);
  };

  Scheduler.prototype.shortTermStability = function (stability, rating) {
    const w = this.w;
    let increase = Math.pow(Math.E, w[17] * (rating - 3 + w[18])) * Math.pow(stability, -w[19]);
    if (rating === HARD || rating === GOOD || rating === EASY) increase = Math.max(increase, 1.0);
    return this.clampStability(stability * increase);
  };

  Scheduler.prototype.nextDifficulty = function (difficulty, rating) {
    const w = this.w;
    const arg1 = this.initialDifficulty(EASY, false);
    const delta = -(w[6] * (rating - 3));
    const arg2 = difficulty + (10.0 - difficulty) * delta / 9.0;
    return this.clampDifficulty(w[7] * arg1 + (1 - w[7]) * arg2);
  };

  Scheduler.prototype.nextStability = function (difficulty, stability, r, rating) {
    const w = this.w;
    let next;
    if (rating === AGAIN) {
      const longTerm = w[11] * Math.pow(difficulty, -w[12]) * (Math.pow(stability + 1, w[13]) - 1) *
        Math.pow(Math.E, (1 - r) * w[14]);
      const shortTerm = stability / Math.pow(Math.E, w[17] * w[18]);
      next = Math.min(longTerm, shortTerm);
    } else {
      const hardPenalty = rating === HARD ? w[15] : 1;
      const easyBonus = rating === EASY ? w[16] : 1;
      next = stability * (1 + Math.pow(Math.E, w[8]) * (11 - difficulty) * Math.pow(stability, -w[9]) *
        (Math.pow(Math.E, (1 - r) * w[10]) - 1) * hardPenalty * easyBonus);
    }
    return this.clampStability(next);
  };

  // The (re)learning steps' rule, shared by the Learning and Relearning states.
  Scheduler.prototype.stepInterval = function (card, rating, steps) {
    if (steps.length === 0 || (card.step >= steps.length && rating !== AGAIN)) {
      card.state = REVIEW;
      card.step = null;
      return this.nextInterval(card.stability) * DAY;
    }
    if (rating === AGAIN) {
      card.step = 0;
      return steps[0];
    }
    if (rating === HARD) {
      if (card.step === 0 && steps.length === 1) return steps[0] * 1.5;
      if (card.step === 0 && steps.length >= 2) return (steps[0] + steps[1]) / 2.0;
      return steps[card.step];
    }
    if (rating === GOOD && card.step + 1 !== steps.length) {
      card.step += 1;
      return steps[card.step];
    }
    card.state = REVIEW; // Good on the last step, or Easy
    card.step = null;
    return this.nextInterval(card.stability) * DAY;
  };

  // One review: a new card object (the argument is not changed).
  Scheduler.prototype.review = function (input, rating, now) {
    if (![AGAIN, HARD, GOOD, EASY].includes(rating)) throw new Error("unknown rating " + rating);
    const card = Object.assign({}, input);
    const sinceLast = card.last_review !== null ? wholeDays(now - card.last_review) : null;
    const shortTerm = sinceLast !== null && sinceLast < 1;
    let interval;
    if (card.state === LEARNING || card.state === RELEARNING) {
      if (card.state === LEARNING && (card.stability === null || card.difficulty === null)) {
        card.stability = this.initialStability(rating);
        card.difficulty = this.initialDifficulty(rating, true);
      } else if (shortTerm) {
        card.stability = this.shortTermStability(card.stability, rating);
        card.difficulty = this.nextDifficulty(card.difficulty, rating);
      } else {
        card.stability = this.nextStability(card.difficulty, card.stability, this.retrievability(card, now), rating);
        card.difficulty = this.nextDifficulty(card.difficulty, rating);
      }
      interval = this.stepInterval(card, rating, card.state === LEARNING ? this.learningSteps : this.relearningSteps);
    } else if (card.state === REVIEW) {
      if (shortTerm) {
        card.stability = this.shortTermStability(card.stability, rating);
      } else {
        card.stability = this.nextStability(card.difficulty, card.stability, this.retrievability(card, now), rating);
      }
      card.difficulty = this.nextDifficulty(card.difficulty, rating);
      if (rating === AGAIN && this.relearningSteps.length > 0) {
        card.state = RELEARNING;
        card.step = 0;
        interval = this.relearningSteps[0];
      } else {
        interval = this.nextInterval(card.stability) * DAY;
      }
    } else {
      throw new Error("unknown card state " + card.state);
    }
    card.due = now + interval;
    card.last_review = now;
    return card;
  };

  window.LabFSRS = { Scheduler: Scheduler, DEFAULT_PARAMETERS: DEFAULT_PARAMETERS, DAY: DAY,
    RATINGS: { Again: AGAIN, Hard: HARD, Good: GOOD, Easy: EASY } };
})();
