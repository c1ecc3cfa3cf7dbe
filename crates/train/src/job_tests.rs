//! The loop on a fake job whose loss is its step counter and whose time is
//! counted, not waited for: a step takes one second, a validation half a
//! second.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use super::*;

/// What the fake job keeps in its checkpoint.
#[derive(Debug, Clone, PartialEq, Default)]
struct State {
    clock: Clock,
    /// `(seconds, loss)` of every step; the loss is the step's index.
    losses: Vec<(f64, f64)>,
    /// The learning rate of every step.
    lrs: Vec<f32>,
    /// The step at which each validation ran.
    validations: Vec<u64>,
}

struct Counter {
    state: State,
    budget: Budget,
    /// The clock of the test, moved by steps and validations.
    time: Rc<Cell<f64>>,
    /// The checkpoint "file".
    disk: Rc<RefCell<Option<State>>>,
    /// The step at each save.
    saves: Vec<u64>,
    /// A step index at which the job fails (a run killed there).
    fail_at: Option<u64>,
}

impl Counter {
    /// A fresh job, or one opened from the checkpoint on `disk`.
    fn open(budget: Budget, time: &Rc<Cell<f64>>, disk: &Rc<RefCell<Option<State>>>) -> Self {
        Self {
            state: disk.borrow().clone().unwrap_or_default(),
            budget,
            time: time.clone(),
            disk: disk.clone(),
            saves: Vec::new(),
            fail_at: None,
        }
    }
}

impl Job for Counter {
    type Validation = u64;

    fn budget(&self) -> Budget {
        self.budget
    }

    fn peak_lr(&self) -> f32 {
        0.5
    }

    fn clock(&mut self) -> &mut Clock {
        &mut self.state.clock
    }

    fn step(&mut self, lr: f32) -> Result<f64> {
        if self.fail_at == Some(self.state.clock.step) {
            return Err(TrainError::Input("killed".into()));
        }
        self.time.set(self.time.get() + 1.0);
        let s = &mut self.state;
        let loss = s.clock.step as f64;
        s.losses.push((s.clock.seconds, loss));
        s.lrs.push(lr);
        s.clock.step += 1;
        Ok(loss)
    }

    fn validated(&self) -> bool {
        !self.state.validations.is_empty()
    }

    fn validate(&mut self) -> Result<u64> {
        self.time.set(self.time.get() + 0.5);
        Ok(self.state.clock.step)
    }

    fn keep(&mut self, v: u64) {
        self.state.validations.push(v);
    }

    fn save(&mut self) -> Result<()> {
        *self.disk.borrow_mut() = Some(self.state.clone());
        self.saves.push(self.state.clock.step);
        Ok(())
    }
}

fn steps(n: u64) -> Budget {
    Budget {
        steps: Some(n),
        seconds: None,
    }
}

const NEVER: Cadence = Cadence {
    validate_every: None,
    save_every: f64::INFINITY,
};

/// Runs `job` to its budget; returns the session and the events' steps.
fn run(job: &mut Counter, cadence: Cadence) -> (Session, Vec<u64>) {
    let time = job.time.clone();
    let mut stepped = Vec::new();
    let session = train(job, &cadence, &mut || time.get(), &mut |e| {
        if let Event::Stepped { clock, .. } = e {
            stepped.push(clock.step);
        }
    })
    .unwrap();
    (session, stepped)
}

fn fresh(budget: Budget) -> Counter {
    Counter::open(
        budget,
        &Rc::new(Cell::new(0.0)),
        &Rc::new(RefCell::new(None)),
    )
}

#[test]
fn a_step_budget_stops_the_run_and_the_rate_follows_the_cosine() {
    let mut job = fresh(steps(10));
    let (session, stepped) = run(&mut job, NEVER);
    assert_eq!(session.steps, 10);
    assert_eq!(stepped, (1..=10).collect::<Vec<_>>());
    let s = &job.state;
    assert_eq!(s.clock.step, 10);
    assert_eq!(s.clock.seconds, 10.0);
    assert_eq!(s.clock.step_seconds, 10.0);
    let losses: Vec<f64> = s.losses.iter().map(|l| l.1).collect();
    assert_eq!(losses, (0..10).map(|i| i as f64).collect::<Vec<_>>());
    // Each loss is logged at the seconds before its step.
    assert_eq!(s.losses[3].0, 3.0);
    assert_eq!(s.lrs[0], 0.5);
    for (i, &lr) in s.lrs.iter().enumerate() {
        assert_eq!(lr, cosine_at(0.5, i as f64 / 10.0));
    }
    assert!(s.lrs.windows(2).all(|w| w[1] < w[0]));
    // Only the first validation: no cadence.
    assert_eq!(s.validations, vec![0]);
    // A run whose budget is spent takes no step.
    let (again, _) = run(&mut job, NEVER);
    assert_eq!(again.steps, 0);
}

#[test]
fn a_time_budget_counts_validations_but_not_the_first() {
    let budget = Budget {
        steps: None,
        seconds: Some(5.0),
    };
    let mut job = fresh(budget);
    run(&mut job, NEVER);
    assert_eq!(job.state.clock.step, 5);
    // Validating every 2 s of training (0.5 s each) leaves room for 4.
    let mut job = fresh(budget);
    let cadence = Cadence {
        validate_every: Some(2.0),
        ..NEVER
    };
    run(&mut job, cadence);
    assert_eq!(job.state.clock.step, 4);
    assert_eq!(job.state.clock.seconds, 5.0);
    assert_eq!(job.state.clock.step_seconds, 4.0);
    assert_eq!(job.state.validations, vec![0, 2, 4]);
}

#[test]
fn validation_runs_at_its_cadence() {
    let mut job = fresh(steps(10));
    let cadence = Cadence {
        validate_every: Some(3.0),
        ..NEVER
    };
    let mut seen = Vec::new();
    let time = job.time.clone();
    train(&mut job, &cadence, &mut || time.get(), &mut |e| {
        if let Event::Validated {
            validation,
            seconds,
            first,
        } = e
        {
            seen.push((*validation, seconds, first));
        }
    })
    .unwrap();
    // Steps of 1 s, validations of 0.5 s counted from the second on:
    // after steps 3 (3.5 s), 6 (7 s) and 9 (10.5 s).
    assert_eq!(job.state.validations, vec![0, 3, 6, 9]);
    assert_eq!(
        seen,
        vec![
            (0, 0.5, true),
            (3, 0.5, false),
            (6, 0.5, false),
            (9, 0.5, false)
        ]
    );
    assert_eq!(job.state.clock.seconds, 11.5);
}

#[test]
fn checkpoints_follow_session_time_and_a_resumed_run_goes_on_where_it_stopped() {
    let cadence = Cadence {
        validate_every: None,
        save_every: 4.0,
    };
    // Unbroken: saves after steps 4 and 8 (the first validation's half
    // second comes before the session's clock starts).
    let mut whole = fresh(steps(10));
    run(&mut whole, cadence);
    assert_eq!(whole.saves, vec![4, 8]);

    // Killed after 6 steps: the checkpoint holds step 4.
    let (time, disk) = (Rc::new(Cell::new(0.0)), Rc::new(RefCell::new(None)));
    let mut first = Counter::open(steps(10), &time, &disk);
    first.fail_at = Some(6);
    let t = time.clone();
    assert!(train(&mut first, &cadence, &mut || t.get(), &mut |_| {}).is_err());
    assert_eq!(first.state.clock.step, 6);
    assert_eq!(first.saves, vec![4]);
    assert_eq!(disk.borrow().as_ref().unwrap().clock.step, 4);

    // Opened again with the whole budget: no second first validation,
    // steps 5 to 10, the losses and rates of the unbroken run.
    let mut resumed = Counter::open(steps(10), &time, &disk);
    let (session, stepped) = run(&mut resumed, cadence);
    assert_eq!(session.steps, 6);
    assert_eq!(stepped, (5..=10).collect::<Vec<_>>());
    assert_eq!(resumed.state.validations, vec![0]);
    assert_eq!(resumed.state.losses, whole.state.losses);
    assert_eq!(resumed.state.lrs, whole.state.lrs);
    assert_eq!(resumed.state.clock, whole.state.clock);
    assert_eq!(resumed.saves, vec![8]);
}

#[test]
fn a_job_must_count_its_steps_and_have_a_budget() {
    struct Stuck(Counter);
    impl Job for Stuck {
        type Validation = u64;
        fn budget(&self) -> Budget {
            self.0.budget
        }
        fn peak_lr(&self) -> f32 {
            0.1
        }
        fn clock(&mut self) -> &mut Clock {
            self.0.clock()
        }
        fn step(&mut self, _: f32) -> Result<f64> {
            Ok(1.0)
        }
        fn validated(&self) -> bool {
            true
        }
        fn validate(&mut self) -> Result<u64> {
            Ok(0)
        }
        fn keep(&mut self, _: u64) {}
        fn save(&mut self) -> Result<()> {
            Ok(())
        }
    }
    let mut stuck = Stuck(fresh(steps(3)));
    let err = train(&mut stuck, &NEVER, &mut || 0.0, &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("from step 0 to 0"), "{err}");
    let mut unbounded = fresh(Budget {
        steps: None,
        seconds: None,
    });
    assert!(train(&mut unbounded, &NEVER, &mut || 0.0, &mut |_| {}).is_err());
    assert!(unbounded.state.validations.is_empty());
}

#[test]
fn flags_make_the_budget() {
    let b = |m, s| Budget::from_flags(m, s, 45.0);
    assert_eq!(
        b(None, None),
        Budget {
            steps: None,
            seconds: Some(2700.0)
        }
    );
    assert_eq!(
        b(None, Some(7)),
        Budget {
            steps: Some(7),
            seconds: None
        }
    );
    assert_eq!(
        b(Some(2.0), None),
        Budget {
            steps: None,
            seconds: Some(120.0)
        }
    );
    assert_eq!(
        b(Some(2.0), Some(7)),
        Budget {
            steps: Some(7),
            seconds: Some(120.0)
        }
    );
    let both = b(Some(1.0), Some(10));
    let at = |step, seconds| Clock {
        step,
        seconds,
        step_seconds: seconds,
    };
    assert_eq!(both.fraction(&at(5, 30.0)), 0.5);
    assert_eq!(both.fraction(&at(2, 45.0)), 0.75);
    assert!(both.done(&at(10, 1.0)) && both.done(&at(1, 60.0)));
    assert!(!both.done(&at(9, 59.0)));
}
