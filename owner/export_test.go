package owner

// SetTemplateWaitHook has fn told of every keyed seed that waits for the
// build of its template.
func SetTemplateWaitHook(o *Owner, fn func()) { o.tmpl.onWait = fn }

// SetPoolHook has fn told when each start of the warm pools ended.
func SetPoolHook(o *Owner, fn func()) { o.pools.onStarted = fn }

// Children is how many session actors run, listed or not.
func Children(o *Owner) int { return len(o.dir.Children()) }
